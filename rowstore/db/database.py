"""The tables of one node: writes with commit timestamps, reads as of any time.

Design: docs/rfcs/0001 (key index), 0002 (column index), 0003 (time travel). This class is
the one object the node holds; the work is done by its parts, each in its own module:

* :mod:`rowstore.db.registry` — the open tables and their schema histories;
* :mod:`rowstore.db.write.committer` — group commit; the two-phase commit of multi-partition
  batches in :mod:`rowstore.db.write.two_phase`;
* :mod:`rowstore.db.write.participant` — this node's share of a batch coordinated elsewhere;
* :mod:`rowstore.db.read.reader` — snapshots, key ranges, queries; point gets
  (:mod:`rowstore.db.read.points`) and ordered scans (:mod:`rowstore.db.read.scans`);
* :mod:`rowstore.db.read.bridge` — read plans, tails and the change feed for the bridge;
* :mod:`rowstore.db.read.leases` — read leases that hold segments back from collection;
* :mod:`rowstore.db.read.subscribe` — live subscriptions to committed changes (RFC 0015), fed
  by :mod:`rowstore.db.changes`, the tail of committed batches;
* :mod:`rowstore.db.background.maintenance` — checkpoint, merge, seal, offload;
* :mod:`rowstore.db.background.gc` — copy-forward garbage collection, clustered rewrites (RFC 0009);
* :mod:`rowstore.db.serving.leadership` — leading and following replicated partitions (RFC 0010);
* :mod:`rowstore.db.serving.handoff` — moving a one-copy partition to another node through objects;
* :mod:`rowstore.db.tasks` — the one home of background tasks.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, overload

import numpy as np
import pyarrow as pa

from rowstore.db.partition import RUN_CACHES
from rowstore.index.column_cache import RunCache
from rowstore.db.changes import CommitTail
from rowstore.db.write.committer import Committer, WriteResult
from rowstore.db.write.two_phase import decided
from rowstore.db.write.participant import Coordinator
from rowstore.db.read.aggregate import Aggregator, Stats
from rowstore.db.read.bridge import ExternalReads
from rowstore.db.background.gc import GarbageCollector, GcConfig
from rowstore.db.serving.handoff import Handoffs
from rowstore.db.serving.leadership import Leadership
from rowstore.db.read.leases import Leases
from rowstore.db.background.maintenance import Maintenance
from rowstore.db.write.participant import Participant
from rowstore.db.write.local_delete import delete_where
from rowstore.db.read.reader import MAX_LIMIT, PURGE_LAG_MS, Reader
from rowstore.db.read.scans import ScanPage
from rowstore.db.read.subscribe import Subscription, Subscriptions
from rowstore.db.registry import Owns, TableRegistry
from rowstore.db.tasks import BackgroundTasks
from rowstore.hlc import HybridClock
from rowstore.reads.plan import ReadPlan, SegmentSlice
from rowstore.reads.retention import parse_retention
from rowstore.replication.follower import ReplicaStore
from rowstore.schema import SchemaVersion
from rowstore.segments.records import SegmentRecord
from rowstore.segments.store import SegmentStore
from rowstore.tables.conform import PartitionShare
from rowstore.tables.definitions import TableCatalog, TableDef
from rowstore.tables.key_check import Key
from rowstore.timeline import Timeline
from terrafs.errors import NoSpaceError, TerrafsError
from terrafs.fs import TerrascaleFS

__all__ = ["Database", "TablesConfig", "WriteResult"]
log = logging.getLogger("rowstore.database")


@dataclass(frozen=True)
class TablesConfig:
    partitions: int = 8
    seal_bytes: int = 256 << 20
    # offload and the collector write version 2, columnar (docs/format/segment.md §7); a node's
    # config (segments.columnar) turns it on by default, the engine alone (tests, tools) does not
    columnar: bool = False
    memtable_bytes: int = 64 << 20  # all partitions' key memtables together
    column_cache_bytes: int = 256 << 20  # built column-index runs kept in memory, all partitions together
    retention_ms: int = 7 * 86_400_000
    closed_wait_s: float = 2.0
    purge_lag_ms: int = PURGE_LAG_MS  # how far purges trail the retention horizon (reads.py)
    resume_free_bytes: int = 64 << 20  # free space on the block device before writes resume
    ack_timeout_s: float = 10.0  # a replicated write waits this long for a majority (then 503)
    prepare_timeout_s: float = 10.0  # a prepared batch whose coordinator is silent: decided from the catalog
    replica_lease_s: float = 1.0  # a follower refuses another leader this long after hearing one
    progress_every_s: float = 1.0  # a subscriber hears the closed timestamp at least this often (RFC 0015)
    subscriber_bytes: int = 16 << 20  # changes queued for one subscriber at most; beyond, it is ended
    gc: GcConfig = GcConfig()


class Database:
    def __init__(self, fs: TerrascaleFS, cfg: TablesConfig = TablesConfig(), now_ms: Callable[[], int] | None = None,
                 monotonic: Callable[[], float] | None = None,
                 coordinator_gone: Callable[[Coordinator], Awaitable[bool]] | None = None,
                 lost: frozenset[int] = frozenset()):
        """``now_ms``: the wall clock in ms (default the system's); every horizon, closed
        timestamp and commit timestamp of this database reads it. ``monotonic``: the clock of
        replication leases (default ``time.monotonic``; a simulation gives virtual time).
        ``coordinator_gone``: ``async (coordinator) -> bool``, whether a cross-node batch's
        coordinator is gone (the node's cluster view): its prepared batch is then decided at
        once instead of after ``cfg.prepare_timeout_s``. ``lost``: inodes whose local files the
        file system's recovery found gone or recreated empty (a lost block device): a
        replicated partition's copies among them hold nothing.

        The one place the parts are made: in dependency order, each given everything it uses
        when it is made, none wired to another afterwards. Serving comes first of the parts
        that act: a write that misses its ack timeout steps its partition's leader down, and a
        read of a led partition checks the leader's lease, while leadership needs neither (a
        new leader asks the catalog, not the committer, how a prepared batch was decided)."""
        monotonic = monotonic or time.monotonic
        self.fs, self.catalog, self.cfg = fs, fs.catalog, cfg
        # shared by every part
        self.clock = HybridClock(self.catalog, fs.cfg.node_id, now_ms)
        self.timeline = Timeline(self.clock)
        self.tasks = BackgroundTasks()
        self.catalog_tables = TableCatalog(self.catalog, self.clock, fs.entropy)
        # each read passes its table's schemas
        self.store = SegmentStore(fs, seal_bytes=cfg.seal_bytes, lost=lost, columnar=cfg.columnar)
        self.column_runs = RunCache(cfg.column_cache_bytes)
        RUN_CACHES[self.store] = self.column_runs  # every partition over this store shares it
        self.tables = TableRegistry(self.catalog_tables, self.store, self.clock.observe)
        # serving/
        self.replicas = ReplicaStore(fs, cfg.replica_lease_s, monotonic, cfg.resume_free_bytes, lost)
        self.leadership = Leadership(self.store, self.replicas, self.tables, partial(decided, self.catalog),
                                     observe=self.clock.observe, observe_durably=self.clock.observe_durably,
                                     present=self.clock.present, hold_present=self.timeline.hold,
                                     monotonic=monotonic, spawn=self.tasks.spawn)
        self.handoffs = Handoffs(self.store, self.tables, observe=self.clock.observe)
        # read/
        self.reader = Reader(self.store, self.catalog_tables, self.tables, self.clock, self.timeline, self.tasks,
                             self.leadership.check_lease, cfg.retention_ms, cfg.closed_wait_s, cfg.purge_lag_ms)
        # background/ (the maintenance first: a write waits on it past the memtables' stall)
        self.maintenance = Maintenance(self.store, self.catalog_tables, self.tables, self.timeline,
                                       cfg.memtable_bytes, self.reader.purge_horizon, monotonic)
        # write/
        self.commit_tail = CommitTail()  # committed batches of watched tables, until closed (RFC 0015)
        self.committer = Committer(self.catalog, self.catalog_tables, self.tables, self.timeline, self.tasks,
                                   self.leadership.demote, self.commit_tail, cfg.ack_timeout_s, fs.entropy,
                                   room=self.maintenance.room)
        self.participant = Participant(self.catalog, self.catalog_tables, self.committer, self.timeline,
                                       self.tasks, self.reader, cfg.prepare_timeout_s, coordinator_gone)
        self.leases = Leases(self.catalog, self.clock.now_ms, fs.entropy)
        self.aggregator = Aggregator(self.reader)
        self.external = ExternalReads(fs, self.store, self.tables, self.reader, self.leases)
        self.subscriptions = Subscriptions(self.reader, self.external, self.commit_tail, self.timeline, self.tasks,
                                           cfg.progress_every_s, cfg.subscriber_bytes)
        # background/ (the collector)
        self.gc = GarbageCollector(self.store, self.catalog_tables, self.tables, self.timeline, self.leases,
                                   self.reader.purge_horizon, self.maintenance.offload, cfg.gc)

    # -- life cycle -------------------------------------------------------------------------

    async def open(self, owns: Owns | None = None) -> None:
        """Clock, segments (deciding prepared batches), then every table's indexes — in a
        cluster only the partitions ``await owns(table_def)`` names, now and later
        (``TableRegistry.open``, RFC 0010). Nothing uses the database before this returns."""
        await self.clock.open()
        await self.store.open(self.committer.decide_at_recovery)
        await self.committer.forget_recovered()
        await self.gc.recover()
        await self.tables.open(owns)

    async def close(self) -> None:
        self.subscriptions.stop()
        for t, p in list(self.leadership.led()):
            await self.leadership.demote(t, p)
        await self.replicas.close()
        await self.tasks.drain()

    @property
    def closed_ts(self) -> int:
        """Every commit at or below it is durable and visible (reads default to it)."""
        return self.timeline.closed

    @property
    def present_ts(self) -> int:
        """The T of a read of the present here (``Timeline.present``: at or above ``closed_ts``)."""
        return self.timeline.present

    # -- tables -------------------------------------------------------------------------------

    async def create_table(self, name: str, schema: str | SchemaVersion, indexes: Sequence[str] = (),
                           partitions: int | None = None, cluster_by: str | None = None,
                           retention: object = None) -> TableDef:
        """``retention``: ``{"column": c, "keep": "30d"}`` or None (RFC 0016 §5)."""
        d = await self.catalog_tables.create(name, schema, list(indexes), partitions or self.cfg.partitions,
                                             cluster_by, lambda sv: parse_retention(sv, retention))
        await self.tables.table(d)
        return d

    async def set_retention(self, name: str, retention: object) -> TableDef:
        """A new definition version with this retention (None: none); reads as of before it
        keep the old setting."""
        return await self.catalog_tables.set_retention(name, lambda sv: parse_retention(sv, retention))

    async def alter_table(self, name: str, change: Callable[[SchemaVersion], SchemaVersion]) -> TableDef:
        d = await self.catalog_tables.alter(name, change)
        self.tables.altered(d)
        return d

    async def drop_table(self, name: str) -> TableDef:
        return await self.catalog_tables.drop(name)

    async def describe(self, name: str, as_of: int | None = None, trusted: bool = False) -> TableDef:
        """The table's definition (as of T). ``trusted``: T is a read timestamp another node
        chose (it may run ahead of this node's wall clock: waited for, never refused)."""
        if as_of is None:
            return await self.catalog_tables.describe(name)
        return await self.catalog_tables.describe(name, await self.reader.snapshot(as_of, trusted))

    async def list_tables(self, as_of: int | None = None) -> list[TableDef]:
        return await self.catalog_tables.list(None if as_of is None else await self.snapshot(as_of))

    def forget_cached_definitions(self, name: str | None = None) -> None:
        """Another node may have changed a table: read its definition from the catalog again."""
        self.catalog_tables.forget(name)

    # -- writes (rowstore.db.write.committer) ---------------------------------------------------

    async def upsert(self, name: str, data: pa.RecordBatch | pa.Table) -> WriteResult:
        """Insert or replace rows by primary key, atomically; returns once durable and visible."""
        return await self.committer.upsert(name, data)

    async def delete(self, name: str, keys: Sequence[object] | pa.Array) -> WriteResult:
        """Delete rows by primary key (absent keys are fine); ``count`` = keys that existed."""
        return await self.committer.delete(name, keys)

    async def delete_where(self, name: str, where: object = None, bbox: object = None,
                           prefix: object = None, pids: list[int] | None = None) -> WriteResult:
        """Delete every row matching the query's terms at one commit timestamp T, atomically
        across partitions ``pids`` (None: those served here), each served here (RFC 0016 §6);
        ``count`` = rows deleted."""
        return await delete_where(self.participant, self.catalog, self.clock, self.tasks, name, where, bbox, prefix,
                                  pids, self.fs.entropy)

    @overload
    async def write_pieces(self, d: TableDef, pieces: list[PartitionShare], sizes: None = None) -> list[int]: ...

    @overload
    async def write_pieces(self, d: TableDef, pieces: list[PartitionShare],
                           sizes: list[list[int]]) -> list[list[int] | BaseException]: ...

    async def write_pieces(self, d: TableDef, pieces: list[PartitionShare],
                           sizes: list[list[int]] | None = None) -> list[int] | list[list[int] | BaseException]:
        """Rows already encoded and split by partition (``Committer.write_pieces``)."""
        return await self.committer.write_pieces(d, pieces, sizes)

    async def existing(self, d: TableDef, pid: int, keys: np.ndarray) -> np.ndarray:
        """Whether each encoded key of partition ``pid`` has a live row now."""
        return await self.committer.existing(d, pid, keys)

    # -- reads (rowstore.db.read.reader) --------------------------------------------------------

    def horizon(self) -> int:
        return self.reader.horizon()

    async def snapshot(self, as_of: int | None = None) -> int:
        return await self.reader.snapshot(as_of)

    async def get(self, name: str, key: object, as_of: int | None = None) -> dict[str, Any] | None:
        return await self.reader.get(name, key, as_of)

    async def get_many(self, name: str, keys: Sequence[object] | pa.Array, as_of: int | None = None) -> pa.Table:
        return await self.reader.get_many(name, keys, as_of)

    async def scan(self, name: str, prefix: object = None, start: object = None, end: object = None,
                   after: int | bytes | None = None, where: list[Any] | None = None,
                   bbox: dict[str, Any] | None = None, columns: list[str] | None = None, limit: int = 10_000,
                   as_of: int | None = None, partitions: list[int] | None = None,
                   trusted: bool = False) -> ScanPage:
        """One page of an ordered scan by key (docs/rfcs/0013): ``Reader.scan``."""
        return await self.reader.scan(name, prefix, start, end, after, where, bbox, columns, limit, as_of,
                                      partitions, trusted)

    async def get_rows(self, name: str, keys: Sequence[object], as_of: int | None = None,
                       columns: list[str] | None = None, partitions: list[int] | None = None,
                       trusted: bool = False) -> tuple[pa.Table, int]:
        """Many rows by key, each with ``__pos`` (``Reader.get_rows``)."""
        return await self.reader.get_rows(name, keys, as_of, columns, partitions, trusted)

    async def read_all(self, name: str, prefix: object = None, start: object = None, end: object = None,
                       as_of: int | None = None, columns: list[str] | None = None) -> tuple[pa.Table, int]:
        """Every row of a scan at one T, in key order, as one answer (tools, tests and
        benchmarks; a client pages with cursors instead): (rows, T). One read, not pages: each
        page checks its T again, and a T older than the purge lag is refused — with a retention
        of 0, a read of a million rows outlived it (the GC benchmark's read to quiescence)."""
        page = await self.scan(name, prefix, start, end, as_of=as_of, columns=columns, limit=MAX_LIMIT)
        return page.rows, page.T

    async def get_dicts(self, name: str, keys: Sequence[object], as_of: int | None = None,
                        columns: list[str] | None = None) -> tuple[int, list[dict[str, Any] | None]]:
        """Many rows by key, in the order asked, as dicts (``Reader.get_dicts``)."""
        return await self.reader.get_dicts(name, keys, as_of, columns)

    def scan_partitions(self, d: TableDef, prefix: Sequence[Key]) -> list[int]:
        """The partitions a scan of ``prefix`` (checked components) reads: one, or all."""
        return self.reader.scan_partitions(d, prefix)

    async def query(self, name: str, where: list[Any] | None = None, bbox: dict[str, Any] | None = None,
                    columns: list[str] | None = None, limit: int | None = 10_000, as_of: int | None = None,
                    partitions: list[int] | None = None, trusted: bool = False) -> tuple[pa.Table, int]:
        return await self.reader.query(name, where, bbox, columns, limit, as_of, partitions, trusted)

    async def aggregate(self, name: str, group_by: list[Any] | None, aggregates: list[Any],
                        where: list[Any] | None = None, bbox: dict[str, Any] | None = None, as_of: int | None = None,
                        partitions: list[int] | None = None, trusted: bool = False,
                        nan: str | None = None) -> tuple[pa.Table, int, Stats]:
        """This node's partial aggregate (rowstore.reads.aggregates.finish makes the answer)."""
        return await self.aggregator.aggregate(name, group_by, aggregates, where, bbox, as_of, partitions, trusted,
                                               nan)

    async def histogram(self, name: str, column: str, bbox: dict[str, Any], cells: list[int],
                        where: list[Any] | None = None, as_of: int | None = None, partitions: list[int] | None = None,
                        trusted: bool = False) -> tuple[np.ndarray, int, Stats]:
        return await self.aggregator.histogram(name, column, bbox, cells, where, as_of, partitions, trusted)

    # -- external readers (rowstore.db.read.bridge, rowstore.db.read.leases) --------------------

    async def read_plan(self, name: str, as_of: int | None = None, where: list[Any] | None = None,
                        bbox: dict[str, Any] | None = None, sealed_only: bool = False, lease_s: float = 600.0,
                        partitions: list[int] | None = None, trusted: bool = False,
                        request_id: str | None = None) -> ReadPlan:
        return await self.external.read_plan(name, as_of, where, bbox, sealed_only, lease_s, partitions, trusted,
                                             request_id)

    async def plan_without_leader(self, name: str, T: int, pids: list[int]) -> list[SegmentSlice]:
        return await self.external.plan_without_leader(name, T, pids)

    async def watermarks(self, table_id: str) -> dict[int, int]:
        return await self.external.watermarks(table_id)

    async def query_without_leader(self, name: str, T: int, pids: list[int], where: list[Any] | None = None,
                                   bbox: dict[str, Any] | None = None, limit: int | None = None) -> pa.Table:
        return await self.external.query_without_leader(name, T, pids, where, bbox, limit)

    async def tail(self, name: str, partition: int, as_of: int, where: list[Any] | None = None,
                   bbox: dict[str, Any] | None = None, sealed: list[int] | None = None) -> pa.Table:
        return await self.external.tail(name, partition, as_of, where, bbox, sealed)

    async def changes(self, name: str, after: int, upto: int | None = None, partitions: list[int] | None = None,
                      trusted: bool = False) -> tuple[pa.Table, int]:
        return await self.external.changes(name, after, upto, partitions, trusted)

    async def changed_ts(self, table_id: str, T: int) -> int:
        return await self.external.changed_ts(table_id, T)

    # -- subscriptions (rowstore.db.read.subscribe, RFC 0015) --------------------------------------

    async def subscribe(self, name: str, from_ts: int | None = None, where: list[Any] | None = None,
                        bbox: dict[str, Any] | None = None, prefix: object = None,
                        columns: list[str] | None = None, partitions: list[int] | None = None,
                        trusted: bool = False) -> Subscription:
        """The changes of ``name`` with ``commit_ts > from_ts`` (None: from now) whose new or old
        version matches, then more as they commit; checked before anything is opened
        (``Subscriptions.open``: ``partitions`` and ``trusted`` for a share across nodes)."""
        return await self.subscriptions.open(name, from_ts, where, bbox, prefix, columns, partitions, trusted)

    def unsubscribe(self, sub: Subscription) -> None:
        self.subscriptions.close(sub)

    async def acquire_lease(self, segids: list[int], ttl_s: float, request_id: str | None = None) -> str:
        return await self.leases.acquire(segids, ttl_s, request_id)

    async def renew_lease(self, lease: str, ttl_s: float) -> None:
        await self.leases.renew(lease, ttl_s)

    async def release_lease(self, lease: str) -> None:
        await self.leases.release(lease)

    async def leased_segments(self) -> set[int]:
        return await self.leases.leased_segments()

    # -- background jobs (rowstore.db.background.maintenance) -----------------------------------

    async def maintain(self) -> dict[str, Any]:
        return await self.maintenance.maintain()

    async def checkpoint(self, force: bool = True) -> dict[str, Any]:
        return await self.maintenance.checkpoint(force)

    async def seal(self) -> dict[str, Any]:
        return await self.maintenance.seal()

    async def offload(self) -> dict[str, Any]:
        return await self.maintenance.offload()

    async def collect_garbage(self, table: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        """One garbage-collection pass now (RFC 0009)."""
        return await self.gc.run(table, dry_run)

    async def segment_records(self, table: str | None = None) -> list[tuple[str, SegmentRecord]]:
        return await self.maintenance.segment_records(table)

    def memtable_bytes(self) -> int:
        return self.maintenance.memtable_bytes()

    # -- a full block device -----------------------------------------------------------------------

    def space(self) -> dict[str, Any]:
        """Whether writes are taken: not while a partition's current segment stopped at a
        full block device (they answer ``insufficient_storage``); reads go on regardless."""
        full = self.store.failed_for_space()
        return {"writable": not full, "partitions_full": len(full), "free_bytes": self.fs.block.free_bytes()}

    def can_write(self) -> bool:
        """Whether this node could take writes now: no open file stopped at the device (full, or
        a disk error), and the device (when it tells) has ``resume_free_bytes`` free. An
        election prefers such a node."""
        free = self.fs.block.free_bytes()
        return not self.fs.failing() and (free is None or free >= self.cfg.resume_free_bytes)

    async def resume_writes(self) -> dict[str, Any]:
        """After a write failed at the disk: a replicated partition led here steps down at once
        (a disk error or a full device: its other replicas take writes; this one follows again
        later); the others take writes again once the device does (after a disk error: once
        the failed file can be cut back; when full: once ``resume_free_bytes`` are free —
        offload and GC free space, or the device grew). Run every second by the node; does
        nothing while no file failed."""
        failed = self.store.failed()
        if not failed:
            return {}
        led = [k for k in failed if k in self.store.shippers]
        for table_id, pid in led:
            log.warning("event=leader_disk_failed table=%s partition=%d error=%r", table_id, pid, failed[table_id, pid])
            await self.leadership.demote(table_id, pid)
        free = self.fs.block.free_bytes()
        short = free is not None and free < self.cfg.resume_free_bytes
        due = {k for k, e in failed.items() if k not in led and not (short and isinstance(e, NoSpaceError))}
        out = {"stepped_down": len(led), "revived": 0}
        if short and any(isinstance(e, NoSpaceError) for e in failed.values()):
            assert free is not None  # short: the device told
            out["waiting_for_bytes"] = self.cfg.resume_free_bytes - free
        for part in self.tables.partitions():
            if (part.table_id, part.pid) in due:
                try:
                    out["revived"] += await part.revive()
                except TerrafsError as e:  # the device still fails: tried again next time
                    out["still_failing"] = out.get("still_failing", 0) + 1
                    log.warning("event=revive_failed table=%s partition=%d error=%r", part.table_id, part.pid, e)
        return out

    def flush_stats(self) -> list[dict[str, Any]]:
        return self.store.flush_stats()
