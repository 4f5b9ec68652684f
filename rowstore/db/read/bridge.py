"""What external readers (the Spark bridge) ask a node for (docs/rfcs/0006-external-reads.md):
a read plan pinning a snapshot, the unsealed tail of one partition, and the change feed."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pyarrow as pa

from rowstore.errors import ConflictError, HistoryPurgedError, QueryError, UnavailableError
from rowstore.reads.plan import ReadPlan, SegmentSlice, visible_bitmap
from rowstore.reads.predicates import batch_mask, key_bounds, parse_bbox
from rowstore.rowids import split_rowids
from rowstore.schema import SchemaVersion
from rowstore.tables.keys import partition_of_key
from rowstore.segments.fetch import fetch
from rowstore.segments.records import SegmentRecord, SegState
from rowstore.segments.store import SegmentStore
from rowstore.db.read.feed import feed_segments, read_window, windows
from rowstore.db.read.leases import Leases
from rowstore.db.registry import TableRegistry
from rowstore.db.read.leaderless import plan_offloaded, query_offloaded, read_watermarks
from rowstore.db.read.reader import Reader, candidates, finish
from terrafs.fs import TerrascaleFS


class ExternalReads:
    def __init__(self, fs: TerrascaleFS, store: SegmentStore, tables: TableRegistry, reader: Reader, leases: Leases):
        self.fs, self.store, self.tables, self.reader, self.leases = fs, store, tables, reader, leases

    async def changed_ts(self, table_id: str, T: int) -> int:
        """min(T, the newest commit_ts of the table's segments): every commit of the table at or
        below T is at or below it (segments are the only place rows are committed to)."""
        recs = await self.store.list(table=table_id)
        return min(T, max((self.store.live(r).max_ts for r in recs), default=0))

    async def read_plan(self, name: str, as_of: int | None = None, where: list[Any] | None = None,
                        bbox: dict[str, Any] | None = None, sealed_only: bool = False, lease_s: float = 600.0,
                        partitions: list[int] | None = None, trusted: bool = False,
                        request_id: str | None = None) -> ReadPlan:
        """A snapshot for readers that go to object storage themselves: per offloaded segment
        its object and a bitmap of the localids visible at T (narrowed by the column index when
        ``where``/``bbox`` can use it), and the partitions whose visible rows are still on this
        node (read with :meth:`tail`). A lease keeps the plan's segments from being collected.

        ``partitions``: only those, and no lease — this node's share of a plan across nodes
        (RFC 0010), at the T the coordinating node chose (``trusted``); it takes the lease.
        ``request_id``: the client's id of this plan; plans of one id share one lease
        (``Leases.acquire``), so a client may repeat a plan whose answer it lost."""
        c = await self.reader.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        terms, box = c.terms(where), parse_bbox(c.d.schema, bbox)
        preds = terms + ([box] if box is not None else [])
        by_seg: dict[int, list[np.ndarray]] = {}
        parts = c.table.served() if partitions is None else [c.table.parts[p] for p in partitions]
        pk = c.d.schema.pk
        equal, keys = key_bounds(pk, terms)  # the key range the terms allow; one partition when they name it
        if len(equal) >= pk.partition_columns:
            one = partition_of_key(pk, equal, len(c.table.parts))
            parts = [p for p in parts if p.pid == one]
        if any(p.pid not in c.table.owned for p in parts):
            assert partitions is not None  # the served ones are owned
            raise UnavailableError(f"table {name!r}: partitions {sorted(set(partitions) - c.table.owned)} "
                                   "are not served by this node")
        for part in parts:
            ids = (await part.index.scan(c.T, keys)).rowids
            cands, _ = await candidates(part, preds)
            if cands is not None:
                ids = np.intersect1d(ids, cands, assume_unique=True)
            keep = await self.reader.zone_mask(c, ids, terms, box)  # segments the window misses (RFC 0009)
            if keep is not None:
                ids = ids[keep]
            if c.kept:  # readers take the bitmaps as they are (a count is their cardinality)
                ids = ids[await self.reader.retained(c, part, ids)]
            segs, locs = split_rowids(ids)
            cuts = np.flatnonzero(np.diff(segs)) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(segs)]):
                if b > a:
                    by_seg.setdefault(int(segs[a]), []).append(locs[a:b])
        recs = {r.segid: r for r in await self.store.list(table=c.d.table_id)}
        sealed, tail = [], set()
        for segid, chunks in sorted(by_seg.items()):
            rec = recs.get(segid)
            if rec is None:  # collected between the index scan and the listing: plan again
                raise ConflictError(f"segment {segid} of table {name!r} was collected while planning; retry")
            if rec.state in (SegState.OFFLOADED, SegState.RETIRED):  # a retired one is read until deleted
                f = await self.fs.stat(rec.inode)
                sealed.append(SegmentSlice(segid, f.location, f.object_size, rec.rows,
                                           visible_bitmap(np.concatenate(chunks))))
            else:
                tail.add(rec.partition)
        lease = await self.leases.acquire(sorted(recs), lease_s, request_id) if partitions is None else ""
        # every version the table has had, not only those up to T: a segment may hold rows written
        # after T with a newer schema (invisible at T, but a reader still walks past them)
        latest = await self.tables.latest_def(c.d)
        versions = tuple(c.schemas(v) for v in latest.history if _has(c.schemas, v))
        return ReadPlan(c.T, c.d.name, c.d.table_id, c.d.schema, versions, self.fs.objects.uri,
                        self.fs.kek is not None, tuple(sealed), () if sealed_only else tuple(sorted(tail)), lease)

    async def plan_without_leader(self, name: str, T: int, pids: list[int]) -> list[SegmentSlice]:
        """The sealed slices of ``pids`` at T from their objects alone (their leader does not
        answer; RFC 0010 §6): refused when T is above a partition's watermark."""
        c = await self.reader.context(name, T, trusted=True, leased=False)
        return await plan_offloaded(self.store, self.fs, c.d, c.schemas, pids, c.T)

    async def watermarks(self, table_id: str) -> dict[int, int]:
        """Per partition, the time at or below which reads need no leader (RFC 0010 §6)."""
        return {pid: w.ts for pid, w in (await read_watermarks(self.store.catalog, table_id)).items()}

    async def query_without_leader(self, name: str, T: int, pids: list[int], where: list[Any] | None = None,
                                   bbox: dict[str, Any] | None = None, limit: int | None = None) -> pa.Table:
        """The rows of ``pids`` visible at T matching ``where``/``bbox``, in key order, from
        their objects alone (as :meth:`plan_without_leader`)."""
        c = await self.reader.context(name, T, trusted=True, leased=False)
        assert c.d.schema is not None  # describe() refuses a dropped table
        terms, box = c.terms(where), parse_bbox(c.d.schema, bbox)
        rows = await query_offloaded(self.store, c.d, c.schemas, pids, c.T, terms, box)
        return finish(rows, c.d.schema, None, limit)

    async def tail(self, name: str, partition: int, as_of: int, where: list[Any] | None = None,
                   bbox: dict[str, Any] | None = None, sealed: list[int] | None = None) -> pa.Table:
        """The visible rows at T of one partition that are not in offloaded segments.

        ``sealed``: the segids a read plan sends readers to object storage for; exactly those
        are left out (a segment offloaded after the plan was made still comes from here, so
        a plan's tails and sealed slices never miss or repeat a row)."""
        c = await self.reader.context(name, as_of)
        assert c.d.schema is not None  # describe() refuses a dropped table
        if not 0 <= partition < len(c.table.parts):
            raise QueryError(f"table {name!r} has partitions 0..{len(c.table.parts) - 1}")
        terms, box = c.terms(where), parse_bbox(c.d.schema, bbox)
        ids = (await c.table.parts[partition].index.scan(c.T)).rowids
        if sealed is not None:
            offloaded = set(sealed)
        else:
            offloaded = {r.segid for r in await self.store.list(table=c.d.table_id) if r.state == SegState.OFFLOADED}
        keep = ~np.isin(split_rowids(ids)[0], np.array(sorted(offloaded), np.uint32))
        rows = await fetch(self.store, ids[keep], c.schemas, c.d.schema, f"table {name!r} partition {partition}")
        return pa.Table.from_batches([rows.batch.filter(pa.array(batch_mask(rows.batch, terms, box)))])

    async def changes(self, name: str, after: int, upto: int | None = None, partitions: list[int] | None = None,
                      trusted: bool = False) -> tuple[pa.Table, int]:
        """Every row change committed in (after, upto], in commit order (then key): the columns
        of the schema at ``upto``, plus ``commit_ts`` and ``op`` ("upsert" or "delete").
        ``partitions``: only those (this node's share of a feed across nodes, RFC 0010)."""
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise QueryError(f"after must be a commit timestamp, not {after!r}")
        c = await self.reader.context(name, upto, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        if partitions is not None and set(partitions) - c.table.owned:
            raise UnavailableError(f"table {name!r}: partitions {sorted(set(partitions) - c.table.owned)} "
                                   "are not served by this node")
        if after < (self.reader.purge_horizon() if trusted else self.reader.horizon()) and after != 0:
            raise HistoryPurgedError(f"changes after {after} reach before the retention horizon")
        recs = feed_segments(await self._live_records(c.d.table_id), after, c.T, partitions)
        return await read_window(self.store, c, recs, after, c.T), c.T

    async def change_windows(self, name: str, after: int, upto: int, partitions: list[int], rows: int,
                             ) -> AsyncIterator[tuple[pa.Table, int, int]]:
        """The change feed of ``(after, upto]`` (a T another node chose, as a subscription's
        catch-up's) in consecutive windows of about ``rows`` changes: (the window's changes, as
        :meth:`changes` answers them, its lower and upper bound). One window is held at a time."""
        c = await self.reader.context(name, upto, trusted=True)
        if set(partitions) - c.table.owned:
            raise UnavailableError(f"table {name!r}: partitions {sorted(set(partitions) - c.table.owned)} "
                                   "are not served by this node")
        if after < self.reader.purge_horizon() and after != 0:
            raise HistoryPurgedError(f"changes after {after} reach before the retention horizon")
        recs = feed_segments(await self._live_records(c.d.table_id), after, c.T, partitions)
        for a, b in windows(recs, after, c.T, rows):
            yield await read_window(self.store, c, recs, a, b), a, b

    async def _live_records(self, table_id: str) -> list[SegmentRecord]:
        """The table's segments with their commit timestamps as of now, all taken before the
        first is read: one listed active whose file was sealed and offloaded since the listing
        is read again (the listed row's timestamps are those of its creation), never skipped."""
        out = []
        for rec in await self.store.list(table=table_id):
            if rec.state == SegState.ACTIVE and rec.segid not in self.store.active:
                rec, _ = await self.store.record(rec.segid)
            out.append(self.store.live(rec))
        return out


def _has(schemas: Callable[[int], SchemaVersion], v: int) -> bool:
    try:
        schemas(v)
        return True
    except Exception:  # noqa: BLE001 - a version the lookup does not know
        return False
