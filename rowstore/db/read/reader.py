"""Reads at a snapshot: ``as_of`` resolved to a closed timestamp T, the table definition
at T, and the reconstruction rule applied through the key index — a row version is
visible at T iff it is the newest version of its key with ``commit_ts <= T`` and not a
deletion (RFC 0003). Point gets take a scalar path; many keys, ranges and queries are
vectorized, the column index narrowing candidates that are then re-checked exactly."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from rowstore.codec.point_decoder import PointDecoder
from rowstore.errors import FutureTimestampError, HistoryPurgedError, QueryError, UnavailableError
from rowstore.hlc import MAX_TS, HybridClock, ms_of, ts_from_ms
from rowstore.tables.keys import (KeyRange, encode_columns, encode_one, key_and_partition, key_arrays, key_range,
                                  partition_of_key, partition_one, partitions_of)
from rowstore.reads.zones import group_keep, keep_mask, segments_of
from rowstore.reads.predicates import BBox, Term, batch_mask, fold_ranges, parse_bbox, parse_where
from rowstore.schema import SchemaVersion
from rowstore.segments.fetch import fetch
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableCatalog, TableDef
from rowstore.tables.key_check import (INT64_MAX, INT64_MIN, Key, check_key_lists, check_key_tuple, check_keys,
                                       check_prefix)
from rowstore.db.partition import Partition
from rowstore.timeline import Timeline
from rowstore.db.registry import Table, TableRegistry
from rowstore.db.tasks import BackgroundTasks
from terrafs.failpoints import mutated

MAX_LIMIT = 2**63 - 1  # any limit is fine (docs/REFERENCE.md §3)
# How far the purge horizon trails the retention horizon: a read of the present chosen on one
# node (its closed timestamp, or the largest of several nodes') reaches the others a moment
# later, and a read that passed the check goes on while merges and GC run. History younger
# than retention + this is never purged, so such reads find every version they need.
PURGE_LAG_MS = 5_000
LAGGING_MS = 300  # how far behind the mutation ``lagging_read`` serves a read of the present


@dataclass(frozen=True)
class ReadContext:
    """What every read of one table at one snapshot needs."""

    T: int
    d: TableDef
    table: Table
    schemas: Callable[[int], SchemaVersion]  # version id -> SchemaVersion


@dataclass(frozen=True)
class _PointTable:
    """A table as a point read needs it (plain attributes: read on every get)."""

    gen: int  # the table catalog's generation it was built in
    d: TableDef
    kind: str
    parts: list[Partition]
    nparts: int
    decode: PointDecoder
    owned: set[int]  # the table's partitions served here (the registry's set: it changes in place)


class Reader:
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
        self._points: dict[str, _PointTable] = {}  # name -> what a point read at the present needs

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
        return ReadContext(T, d, table, await self.tables.schemas_of(d))

    async def get(self, name: str, key: object, as_of: int | None = None) -> dict[str, Any] | None:
        """The row with primary key ``key`` as of T (columns and names of T), or None.

        The scalar path: no arrays, one index walk, one row read, one struct unpack; with
        everything it needs in memory, no coroutine is awaited."""
        pt = self._points.get(name) if as_of is None else None
        if pt is not None and pt.gen == self.definitions.generation and self.timeline.floor <= self.timeline.visible:
            T = self._present(self.timeline.visible)
            if pt.d.ts > T:  # the newest definition is not visible yet
                T, pt = await self._point_table(name, as_of)
        else:
            T, pt = await self._point_table(name, as_of)
        k, pid = _point_key(pt, key)
        if pid not in pt.owned:
            raise UnavailableError(f"table {name!r}: partition {pid} is not served by this node")
        if (wait := self.leases_of(pt.d.table_id, (pid,), T)) is not None:
            await wait
        part = pt.parts[pid]
        rowid = part.index.get_cached(k, T)
        if rowid is None:
            rowid = await part.index.get(k, T)
        if part.index.consolidation_due:
            self.tasks.spawn(part.index.merge_memtable())
        if rowid == 0:
            return None
        schema = pt.d.schema
        assert schema is not None  # describe() refuses a dropped table
        return self.store.row_cached(rowid, schema, pt.decode) or await self.store.row(
            rowid, schema, pt.decode, f"table {name!r} partition {pid}")

    async def get_dicts(self, name: str, keys: Sequence[object], as_of: int | None = None,
                        columns: list[str] | None = None) -> tuple[int, list[dict[str, Any] | None]]:
        """The rows of many keys at one T, in the order asked (None: no row), by the scalar path
        of :meth:`get` for each: random keys land in as many segments as keys, where a point
        read's cached blocks and generated decoder beat a vectorized gather per segment. Every
        key is checked before any is read (one bad key: nothing is read)."""
        T, pt = await self._point_table(name, as_of)
        assert pt.d.schema is not None  # _point_table() checked it
        _check_columns(pt.d.schema, columns)
        located = [_point_key(pt, k) for k in keys]
        missing = sorted({pid for _, pid in located} - pt.owned)
        if missing:
            raise UnavailableError(f"table {name!r}: partitions {missing} are not served by this node")
        if (wait := self.leases_of(pt.d.table_id, {pid for _, pid in located}, T)) is not None:
            await wait
        schema = pt.d.schema
        out: list[dict[str, Any] | None] = [None] * len(located)
        cold: list[int] = []  # keys whose index page or row's block (or pages) is not in memory
        for i, (k, pid) in enumerate(located):
            rowid = pt.parts[pid].index.get_cached(k, T)
            # a columnar row from its decoded pages, a row-wise one from its block (as ``get``)
            hit = self.store.row_cached(rowid, schema, pt.decode) if rowid else None
            if rowid is None or (rowid and hit is None):
                cold.append(i)
            elif hit is not None:
                out[i] = _project(hit, columns)

        async def read(i: int, gate: asyncio.Semaphore) -> None:
            async with gate:
                k, pid = located[i]
                rowid = await pt.parts[pid].index.get(k, T)
                if rowid:
                    row = await self.store.row(rowid, schema, pt.decode, f"table {name!r} partition {pid}")
                    out[i] = _project(row, columns)
        if cold:  # their reads overlap: each waits on an object or the disk cache, off the loop
            gate = asyncio.Semaphore(_COLD_READS)
            async with asyncio.TaskGroup() as tg:
                for i in cold:
                    tg.create_task(read(i, gate))
        return T, out

    async def _point_table(self, name: str, as_of: int | None) -> tuple[int, _PointTable]:
        """The read timestamp and the table as point reads need it; kept for reads at the
        present while the catalog's generation stands and the definition is the newest."""
        gen = self.definitions.generation
        T = await self.snapshot(as_of)
        d = await self.definitions.describe(name, T)
        table = self.tables.get(d.table_id) or await self.tables.table(d)
        assert d.schema is not None  # describe() refuses a dropped table
        pt = _PointTable(gen, d, table.kind, table.parts, len(table.parts),
                         PointDecoder(await self.tables.schemas_of(d), d.schema), table.owned)
        if as_of is None and await self.definitions.describe(name) is d:
            self._points[name] = pt
        return T, pt

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
        return finish([(await fetch(self.store, rowids, c.schemas, c.d.schema, f"table {name!r}")).batch],
                      c.d.schema, None, None)

    async def get_rows(self, name: str, keys: Sequence[object], as_of: int | None = None,
                       columns: list[str] | None = None, partitions: list[int] | None = None,
                       trusted: bool = False) -> tuple[pa.Table, int]:
        """The rows of many keys (users' keys) at T, each with ``__pos``, its key's position in
        ``keys`` (a key with no row at T has none; a key asked twice, two); ``partitions``:
        the keys' partitions must be among those (a read across nodes)."""
        c = await self.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        _check_columns(c.d.schema, columns)
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
        t = pa.Table.from_batches([rows]).take(pa.array(np.searchsorted(ids, found[pos])))
        if columns is not None:
            t = t.select(columns)
        return t.append_column("__pos", pa.array(pos, pa.int64())), c.T

    async def scan(self, name: str, prefix: object = None, start: object = None, end: object = None,
                   after: int | bytes | None = None, where: list[Any] | None = None,
                   bbox: dict[str, Any] | None = None, columns: list[str] | None = None, limit: int = 10_000,
                   as_of: int | None = None, partitions: list[int] | None = None,
                   trusted: bool = False) -> ScanPage:
        """One page of an ordered scan (docs/rfcs/0013): the rows visible at T whose key starts
        with ``prefix`` and lies in ``[start, end)`` (each a leading run of the key's components),
        after the encoded key ``after`` (a cursor's), matching ``where``/``bbox``, in key order,
        at most ``limit``. ``partitions``: only those (a scan across nodes asks each node for
        its own); otherwise every partition served here — or only the one a prefix naming the
        whole partition key picks."""
        c = await self.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        pk = c.d.schema.pk
        terms, box = parse_where(c.d.schema, where), parse_bbox(c.d.schema, bbox)
        _check_columns(c.d.schema, columns)
        _check_limit(limit)
        pre = check_prefix(prefix, pk, "prefix")
        rng = key_range(pk, pre, check_prefix(start, pk, "start") or None, check_prefix(end, pk, "end") or None)
        if after is not None:
            rng = rng.after(after)  # type: ignore[arg-type]  # a cursor's key is of the table's kind
        pids = partitions if partitions is not None else self.scan_partitions(c.d, pre, c.table)
        if any(p not in c.table.owned for p in pids):
            raise UnavailableError(f"table {name!r}: partitions {sorted(set(pids) - c.table.owned)} are not "
                                   "served by this node")
        if rng.empty() or limit == 0 or not pids:
            return merge_pages([], limit, c.d.schema, columns, c.T)
        if len(pids) == 1:
            t, k, more = await self._scan_partition(c, c.table.parts[pids[0]], rng, terms, box, limit)
            page = ScanPage(t, k, c.T, more)
        else:
            page = await self._merged(c, pids, rng, terms, box, limit)
        return ScanPage(page.rows.select(columns) if columns is not None else page.rows, page.keys, c.T, page.more)

    async def _merged(self, c: ReadContext, pids: list[int], rng: KeyRange[int] | KeyRange[bytes],
                      terms: list[Term], box: BBox | None, limit: int) -> ScanPage:
        """A page of several partitions merged in key order, each read in rounds of a share of
        the page: rows below the smallest last key of the partitions not exhausted are final
        (none of those partitions holds a smaller key it has not read), so each row is read
        about once — not every partition's whole page to keep one partition's share of it."""
        schema = c.d.schema
        assert schema is not None  # a described table
        per = max(2 * limit // len(pids), 64)
        bufs: dict[int, tuple[pa.Table, np.ndarray]] = {}
        ranges: dict[int, KeyRange[int] | KeyRange[bytes]] = dict.fromkeys(pids, rng)
        done: set[int] = set()
        out: list[ScanPage] = []
        n = 0
        while n < limit:
            for p in pids:
                if p not in done and (p not in bufs or not len(bufs[p][1])):
                    t, k, more = await self._scan_partition(c, c.table.parts[p], ranges[p], terms, box, per)
                    bufs[p] = (t, k)
                    if more and len(k):
                        last: Any = int(k[-1]) if k.dtype == np.uint64 else bytes(k[-1])  # the range's key type
                        ranges[p] = ranges[p].after(last)
                    else:
                        done.add(p)
            live = [p for p in pids if len(bufs[p][1])]
            if not live:
                break
            open_ = [bufs[p][1][-1] for p in pids if p not in done]
            cut = min(open_) if open_ else None
            final: list[ScanPage] = []
            for p in live:
                t, k = bufs[p]
                j = len(k) if cut is None else int(np.searchsorted(k, cut, "right"))
                final.append(ScanPage(t.slice(0, j), k[:j], c.T, False))
                bufs[p] = (t.slice(j), k[j:])
            page = merge_pages(final, limit - n, schema, None, c.T)
            out.append(page)
            n += page.rows.num_rows
            if page.more:  # the merged rows ran past the page: rows are left
                break
        left = n >= limit and (len(done) < len(pids) or any(len(bufs[p][1]) for p in pids))
        merged = merge_pages(out, limit, schema, None, c.T) if len(out) > 1 else out[0] if out else \
            merge_pages([], limit, schema, None, c.T)
        return ScanPage(merged.rows, merged.keys, c.T, left or merged.more)

    def scan_partitions(self, d: TableDef, prefix: Sequence[Key], table: Table | None = None) -> list[int]:
        """The partitions a scan reads: the one its prefix picks when the prefix covers the
        partition key, else all (of those served here, given ``table``)."""
        assert d.schema is not None  # a described table
        pk = d.schema.pk
        if len(prefix) >= pk.partition_columns:
            return [partition_of_key(pk, prefix, d.partitions)]
        return sorted(table.owned) if table is not None else list(range(d.partitions))

    async def _scan_partition(self, c: ReadContext, part: Partition, rng: KeyRange[int] | KeyRange[bytes],
                              terms: list[Term], box: BBox | None, limit: int) -> tuple[pa.Table, np.ndarray, bool]:
        """Up to ``limit`` matching rows of one partition in key order, their encoded keys, and
        whether it may hold more: rounds of the key index (``scan_chunk``), growing, until the
        page is full or the range ends — never the whole range at once."""
        schema = c.d.schema
        assert schema is not None  # a described table
        batches: list[pa.RecordBatch] = []
        keys: list[np.ndarray] = []
        n, entries = 0, max(2 * limit, 1024)
        rest: KeyRange[int] | KeyRange[bytes] | None = rng
        while rest is not None and n < limit:
            vis, nxt = await part.index.scan_chunk(rest, c.T, entries)
            if nxt is not None and not len(vis) and (nxt.lo, nxt.lo_inc) == (rest.lo, rest.lo_inc):
                entries *= 4  # one key's versions fill a round: read further
                continue
            rest, entries = nxt, min(2 * entries, _MAX_ROUND)
            if not len(vis):
                continue
            batch, ks = await self._in_key_order(c, part, vis.rowids), vis.keys
            if terms or box is not None:
                m = np.asarray(batch_mask(batch, terms, box), bool)
                batch, ks = batch.filter(pa.array(m)), ks[m]
            take = min(limit - n, batch.num_rows)
            batches.append(batch.slice(0, take))
            keys.append(ks[:take])
            n += take
            if take < batch.num_rows:
                return pa.Table.from_batches(batches), np.concatenate(keys), True
        table = pa.Table.from_batches(batches, schema=schema.arrow())
        return table, np.concatenate(keys) if keys else _no_keys(part.kind), rest is not None

    async def _in_key_order(self, c: ReadContext, part: Partition, rowids: np.ndarray) -> pa.RecordBatch:
        """The rows of ``rowids`` (in key order) in that order: fetched in rowid order, put back
        unless the rowids rise already (a source's readings are appended in time order)."""
        assert c.d.schema is not None  # a described table
        if len(rowids) < 2 or bool((rowids[1:] > rowids[:-1]).all()):
            return (await fetch(self.store, rowids, c.schemas, c.d.schema, _where(c, part))).batch
        order = np.argsort(rowids, kind="stable")
        rows = await fetch(self.store, rowids[order], c.schemas, c.d.schema, _where(c, part))
        inv = np.empty_like(order)
        inv[order] = np.arange(len(order))
        return rows.batch.take(pa.array(inv))

    async def query(self, name: str, where: list[Any] | None = None, bbox: dict[str, Any] | None = None,
                    columns: list[str] | None = None, limit: int | None = 10_000, as_of: int | None = None,
                    partitions: list[int] | None = None, trusted: bool = False) -> tuple[pa.Table, int]:
        """Rows visible at T matching every ``where`` term and the bounding box, in key order;
        ``partitions``: only those (a read across nodes asks each node for its own)."""
        c = await self.context(name, as_of, trusted)
        assert c.d.schema is not None  # describe() refuses a dropped table
        terms, box = parse_where(c.d.schema, where), parse_bbox(c.d.schema, bbox)
        _check_columns(c.d.schema, columns)
        _check_limit(limit)
        parts = c.table.served() if partitions is None else [c.table.parts[p] for p in partitions]
        if any(p.pid not in c.table.owned for p in parts):
            assert partitions is not None  # the served ones are owned
            raise UnavailableError(f"table {name!r}: partitions {sorted(set(partitions) - c.table.owned)} "
                                   "are not served by this node")
        target = narrowed(c.d.schema, columns, terms, box)
        out = [widened(await self._query_part(c, part, terms, box, limit, target), c.d.schema) for part in parts]
        return finish(out, c.d.schema, columns, limit), c.T

    async def _query_part(self, c: ReadContext, part: Partition, terms: list[Term], box: BBox | None,
                          limit: int | None, target: SchemaVersion) -> pa.RecordBatch:
        """The partition's matching rows with ``target``'s columns (the key and the terms'
        columns among them): a columnar segment reads only those."""
        assert c.d.schema is not None  # describe() refuses a dropped table
        cands, srcs = candidates(part, terms + ([box] if box is not None else []))
        if cands is None:  # no index applies: the partition's visible rows, in key order
            return await self._scan_part(c, part, terms, box, limit, target)
        assert srcs is not None  # set with cands
        keep = await self.zone_mask(c, cands, terms, box)
        if keep is not None:
            cands, srcs = cands[keep], srcs[keep]
        rows = await fetch(self.store, cands, c.schemas, target, _where(c, part))  # in rowid order, as cands
        keys = encode_columns(c.d.schema.pk, key_arrays(c.d.schema.pk, rows.batch))
        visible = (rows.commit_ts <= np.uint64(c.T)) & ~rows.deleted
        idx = np.flatnonzero(visible)
        visible[idx] = ~await part.index.superseded(keys[idx], rows.commit_ts[idx], srcs[idx], c.T)
        return rows.batch.filter(pa.array(visible & batch_mask(rows.batch, terms, box)))

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
            rows = await fetch(self.store, chunk, c.schemas, target, _where(c, part))  # rowid order
            got.append(rows.batch.filter(pa.array(batch_mask(rows.batch, terms, box))))
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


def _project(row: dict[str, Any], columns: list[str] | None) -> dict[str, Any]:
    return row if columns is None else {c: row[c] for c in columns}


def _where(c: ReadContext, part: Partition) -> str:
    """What a corruption found reading ``part`` names."""
    return f"table {c.d.name!r} partition {part.pid}"


def _point_key(pt: _PointTable, key: object) -> tuple[int | bytes, int]:
    """One user key, checked against its columns' types, as the index's scalar, and its partition."""
    assert pt.d.schema is not None  # _point_table() checked it
    pk = pt.d.schema.pk
    if pk.kind == "int64" and type(key) is int and INT64_MIN <= key <= INT64_MAX:  # the common case, first
        k: int | bytes = encode_one(key, "int64")
        return k, partition_one(k, pt.nparts)
    return key_and_partition(pk, check_key_tuple(key, pk), pt.nparts)


def candidates(part: Partition, preds: list[Term | BBox]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Sorted rowids every usable column index allows, with each one's source run (RFC 0002);
    (None, None) when no predicate can use an index."""
    cands = srcs = None
    for pred in fold_ranges(preds):
        got = part.columns.candidates(pred)
        if got is None:
            continue
        if cands is None:
            cands, srcs = got
        else:
            assert srcs is not None  # set with cands
            cands, i, _ = np.intersect1d(cands, got[0], assume_unique=True, return_indices=True)
            srcs = srcs[i]
    return cands, srcs


def _check_columns(schema: SchemaVersion, columns: list[str] | None) -> None:
    if columns is None:
        return
    if not isinstance(columns, (list, tuple)) or not all(isinstance(c, str) for c in columns):
        raise QueryError("columns must be a list of column names")
    for c in columns:
        if schema.by_name(c) is None:
            raise QueryError(f"no column {c!r}")


def _check_limit(limit: int | None) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise QueryError(f"limit must be a non-negative integer, not {limit!r}")


_MAX_ROUND = 1 << 20  # index entries a scan's round reads per source, at most
_COLD_READS = 16  # a multi-get's reads of keys not in memory, in flight at once


@dataclass(frozen=True)
class ScanPage:
    """One page of a scan: its rows (key order, the asked columns), their encoded keys, the
    snapshot, and whether rows may follow the last one (a full page: continue after it)."""

    rows: pa.Table
    keys: np.ndarray
    T: int
    more: bool

    @property
    def last(self) -> int | bytes | None:
        """The encoded key of the page's last row (where the next page starts after)."""
        if not len(self.keys):
            return None
        k = self.keys[-1]
        return int(k) if self.keys.dtype == np.uint64 else bytes(k)


def _no_keys(kind: str) -> np.ndarray:
    return np.zeros(0, np.uint64 if kind == "int64" else "S1")


def merge_pages(pages: list[ScanPage], limit: int, schema: SchemaVersion, columns: list[str] | None,
                T: int) -> ScanPage:
    """Pages of several partitions (or nodes) at one T merged in key order, cut to ``limit``:
    rows may follow when any page was full or rows were cut."""
    full = [p for p in pages if p.rows.num_rows]
    more = any(p.more for p in pages)
    if not full:
        empty = schema.arrow().empty_table()
        return ScanPage(empty.select(columns) if columns is not None else empty, _no_keys(schema.pk.kind), T, more)
    t = pa.concat_tables([p.rows for p in full], promote_options="default")
    keys = np.concatenate([p.keys for p in full])
    more = more or t.num_rows > limit
    if len(full) > 1:
        order = np.argsort(keys, kind="stable")[:limit]
        t, keys = t.take(pa.array(order)), keys[order]
    return ScanPage(t.slice(0, limit), keys[:limit], T, more)


def narrowed(schema: SchemaVersion, columns: list[str] | None, terms: list[Term], box: BBox | None) -> SchemaVersion:
    """``schema`` with only what a read returns and tests: ``columns`` (all when None), the
    key and the columns of the terms and the bbox."""
    if columns is None:
        return schema
    keep = {*columns, *schema.pk.names, *(t.column.name for t in terms), *([box.column.name] if box else [])}
    return replace(schema, columns=tuple(x for x in schema.columns if x.name in keep))


def widened(batch: pa.RecordBatch, schema: SchemaVersion) -> pa.RecordBatch:
    """``batch`` with every column of ``schema`` (those it lacks: nulls, never returned)."""
    if batch.num_columns == len(schema.columns):
        return batch
    return pa.RecordBatch.from_arrays(
        [batch.column(x.name) if batch.schema.get_field_index(x.name) >= 0 else pa.nulls(batch.num_rows, x.type.arrow())
         for x in schema.columns], schema=schema.arrow())


def _empty_batch(schema: SchemaVersion) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], c.type.arrow()) for c in schema.columns], schema=schema.arrow())


def finish(parts: list[pa.RecordBatch], schema: SchemaVersion, columns: list[str] | None,
           limit: int | None) -> pa.Table:
    """Partitions' rows as one table in key order, cut to ``limit``, with ``columns``."""
    t = pa.Table.from_batches([p for p in parts if p.num_rows], schema=schema.arrow()) if any(
        p.num_rows for p in parts) else schema.arrow().empty_table()
    if t.num_rows > 1:
        t = t.sort_by([(k, "ascending") for k in schema.pk.names])
    if limit is not None:
        t = t.slice(0, limit)
    return t.select(list(columns)) if columns is not None else t
