"""One table partition on this node: its single writer, its segments, its indexes.

The writer lock orders everything that must not interleave in the partition's
write-ahead log: a batch's timestamp and its append (so ts order = log order),
a prepared batch and its COMMIT (RFC 0003), a checkpoint's freeze and mark, and a
segment roll. It is held only while bytes are *enqueued*, never across a group
commit's fdatasync — except by a multi-partition batch between its prepare and
its decision, which is what keeps ``BATCH X`` the log's last batch until decided.
"""
from __future__ import annotations

import asyncio
import weakref
import logging
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from rowstore.errors import UnavailableError
from terrafs.errors import ClosedError
from rowstore.segments.active import ActiveSegment
from rowstore.rowids import rowids as make_rowids, TOMBSTONE
from rowstore.index.column_cache import RunCache
from rowstore.index.column_index import PartitionColumns
from rowstore.tables.keys import encode_columns, key_arrays
from rowstore.index.key_index import PartitionIndex
from rowstore.index.key_manifest import Claim
from rowstore.codec.rows import Encoded, EncodedParts
from rowstore.schema import Column, SchemaVersion
from rowstore.segments.records import SegmentRecord, SegState
from rowstore.segments.store import SegmentStore
from rowstore.segments.wal import U64, RecordKind

log = logging.getLogger("rowstore.db.partition")


# a node's cache of built column-index runs, by its segment store (set by Database): the
# partitions of one node share one budget, whichever part of the node made them
RUN_CACHES: weakref.WeakKeyDictionary[SegmentStore, RunCache] = weakref.WeakKeyDictionary()


def manifest_key(table_id: str, pid: int) -> str:
    return f"idx/{table_id}/{pid:03d}/manifest"


class Partition:
    def __init__(self, store: SegmentStore, table_id: str, pid: int, key_kind: str, indexed: list[Column]):
        self.store, self.table_id, self.pid, self.kind = store, table_id, pid, key_kind
        self.columns = PartitionColumns(store.fs, manifest_key(table_id, pid), indexed, RUN_CACHES.get(store))
        # live counts move as merges purge versions
        self.index = PartitionIndex(store.fs, manifest_key(table_id, pid), key_kind, self.columns, store.superseded)
        self.lock = asyncio.Lock()
        self._inflight = 0  # batches enqueued but not yet applied (or failed)
        self._drained = asyncio.Event()
        self._drained.set()
        # Set when this node stops serving the partition (a demotion, a hand-over): a writer or
        # a background job still holding this object must not touch the partition's log again
        # — no new segment (nobody would replay it), no roll, PROGRESS or revive of the current
        # one: the store keys that by (table, partition), and if the partition is served here
        # again, a new object with a new writer lock orders it (docs/rfcs/0010-replication.md).
        self.retired = False
        self.newest_ts = 0  # set by open(): the newest commit timestamp the partition holds

    # -- recovery ------------------------------------------------------------------------

    async def open(self, schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
                   claim: Claim | None = None) -> int:
        """Claim the index for the node serving the partition now (``claim``), load its runs and
        replay the write-ahead after the checkpoint mark."""
        manifest = await self.index.open(claim)
        mark = manifest.mark + [0] * (3 - len(manifest.mark))  # (segid, localid, seq)
        replayed = 0
        recs = await self.segments()
        # the newest commit the partition holds: a node serving it must commit above it (its
        # clock may run behind the node that wrote it — a moved partition after a restart)
        self.newest_ts = max([r.max_ts or 0 for r in recs] + [r.max_ts for _, r in self.index.runs], default=0)
        for rec in recs:
            skip = replay_from(rec, mark)
            if skip is None:
                continue
            base = 0
            async for d in self.store.scan(rec.segid, target, schemas):
                n = d.batch.num_rows
                lo = max(skip - base, 0)
                if lo < n:
                    self.apply(np.arange(base + lo, base + n), rec.segid, d.batch.slice(lo), d.commit_ts[lo:],
                               d.deleted[lo:], target)
                    replayed += n - lo
                    self.newest_ts = max(self.newest_ts, int(d.commit_ts[lo:].max()))
                base += n
        return replayed

    async def segments(self) -> list[SegmentRecord]:
        recs = [r for r in await self.store.list(table=self.table_id) if r.partition == self.pid]
        return sorted(recs, key=lambda r: r.seq)

    # -- writes ----------------------------------------------------------------------------

    def apply(self, localids: np.ndarray, segid: int, batch: pa.RecordBatch, ts: int | np.ndarray, deleted: np.ndarray,
              schema: SchemaVersion, keys: np.ndarray | None = None, pos: np.ndarray | None = None) -> None:
        """Make durable rows visible: key index entries and column index values. The rows are
        ``batch`` — or with ``pos``, rows ``pos`` of it, which the column index takes only when
        it needs them; ``keys``: their keys already encoded, if the caller has them."""
        ids = make_rowids(segid, np.asarray(localids, np.uint32))
        if keys is None:
            rows = batch if pos is None else batch.take(pa.array(pos))
            keys = encode_columns(schema.pk, key_arrays(schema.pk, rows))
        deleted = np.asarray(deleted, bool)
        self.index.insert(keys, ts, np.where(deleted, TOMBSTONE, ids))
        if self.columns.columns:
            live = None if not deleted.any() else ~deleted
            if pos is not None:
                self.columns.insert(ids if live is None else ids[live], batch, schema,
                                    pos if live is None else pos[live])
            else:
                self.columns.insert(ids if live is None else ids[live],
                                    batch if live is None else batch.filter(pa.array(live)), schema)

    def apply_deletions(self, keys: np.ndarray, ts: int) -> None:
        """Make durable deletions of ``keys`` (encoded) visible: key index entries only (a
        deletion puts nothing in the column index)."""
        self.index.insert(keys, ts, np.full(len(keys), TOMBSTONE, np.uint64))

    async def current(self) -> ActiveSegment:
        if self.retired:
            raise UnavailableError(f"partition {self.pid} is no longer led by this node; retry")
        return await self.store.current(self.table_id, self.pid)

    def enter(self) -> None:
        self._inflight += 1
        self._drained.clear()

    def leave(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._drained.set()

    async def append(self, seg: ActiveSegment, enc: Encoded | EncodedParts, ts: int,
                     txn: int | None = None, piece: bool = False) -> asyncio.Task[np.ndarray]:
        """Enqueue a batch (``piece``: a piece of prepared ``txn``) now (call order = log order);
        the task returns its rowids once durable. A partition this node stopped leading (or a
        node shutting down) closes its files under a writer that took the segment before: that
        write failed whole and may be retried."""
        task = asyncio.ensure_future(self._append(seg, enc, ts, txn, piece))
        await asyncio.sleep(0)  # let the task take its localids and enqueue its bytes under our lock
        return task

    async def _append(self, seg: ActiveSegment, enc: Encoded | EncodedParts, ts: int, txn: int | None,
                      piece: bool) -> np.ndarray:
        if self.retired:  # in the task, so the caller's in-flight accounting sees the failure
            raise UnavailableError(f"partition {self.pid} is no longer led by this node; retry")
        try:
            return await seg.append_encoded(enc, ts, txn, piece)
        except ClosedError as e:
            raise UnavailableError(f"partition {self.pid} stopped taking writes here ({e}); retry") from e

    async def settled(self) -> None:
        """Until every batch in flight is applied (or failed); the caller holds the writer lock,
        so none starts meanwhile."""
        await self._drained.wait()

    async def drain(self) -> None:
        """Wait until no batch is in flight (appended but not yet applied, or failed)."""
        async with self.lock:
            await self._drained.wait()

    async def revive(self) -> bool:
        """Writes again after a full device or a disk error (``SegmentStore.revive``), under
        the writer lock with nothing in flight."""
        async with self.lock:
            await self._drained.wait()
            return not self.retired and await self.store.revive(self.table_id, self.pid)

    def full(self) -> bool:
        """Whether the current segment reached the seal size (then ``roll(if_full=True)``)."""
        seg = self.store.current_or_none(self.table_id, self.pid)
        return seg is not None and seg.nbytes >= self.store.seal_bytes

    async def roll(self, if_full: bool = False) -> int | None:
        """Seal the current segment (if it has rows; with ``if_full``, if it is still full
        once the lock is ours) under the writer lock."""
        async with self.lock:
            await self._drained.wait()
            if self.retired or (if_full and not self.full()):
                return None
            seg = await self.store.roll(self.table_id, self.pid)
            return seg.segid if seg is not None else None

    async def progress(self, closed: int) -> bool:
        """Record ``PROGRESS(closed)`` in the current segment (docs/format/segment.md §2) when
        batches arrived since the last one recorded; it rides with the next flush."""
        async with self.lock:  # ordered with the partition's batches
            seg = None if self.retired else self.store.current_or_none(self.table_id, self.pid)
            if seg is None or closed <= seg.wal.closed_ts or (seg.max_ts or 0) <= seg.wal.closed_ts:
                return False  # nothing new since the last record: an idle partition writes nothing
            task = asyncio.ensure_future(seg.append_record(RecordKind.PROGRESS, U64.pack(closed), lazy=True))
            await asyncio.sleep(0)
        await task
        return True

    # -- checkpoint and merge --------------------------------------------------------------

    async def checkpoint(self) -> bool:
        """Freeze the memtables with nothing in flight, then publish them with the mark."""
        async with self.lock:
            await self._drained.wait()
            seg = self.store.current_or_none(self.table_id, self.pid)
            if seg is not None:
                rec, _ = await self.store.record(seg.segid)
                mark = [seg.segid, seg.durable_rows, rec.seq]
            else:
                mark = await self._mark_between()
            if self.index.mem.entries == 0:  # every entry in runs: the mark alone may move on
                return await self.index.advance_mark(mark)
            token = self.index.begin_checkpoint()
        return await self.index.finish_checkpoint(token, mark)

    async def _mark_between(self) -> list[int]:
        """The mark with no segment current here: the next segment starts the replay — unless
        an active segment row of the partition lies below it (a create whose file failed after
        its catalog row; simulation seed 53719). A promotion may adopt that segment and append
        to it, and rows appended there must be replayed, so the mark stays at its first row not
        applied here (docs/format/index-run.md: the mark never passes an active segment)."""
        active = [r for r in await self.segments() if r.state == SegState.ACTIVE]
        if not active:
            return [0, 0, await self.store.next_seq(self.table_id, self.pid)]
        low = active[0]  # segments() is in seq order
        seg = self.store.active.get(low.segid)
        return [low.segid, seg.durable_rows if seg is not None else 0, low.seq]

    async def merge(self, horizon: int) -> bool:
        return await self.index.maybe_merge(horizon)

    @property
    def mem_bytes(self) -> int:
        return self.index.mem.nbytes + self.columns.mem_bytes

    @property
    def busy(self) -> bool:
        """A checkpoint, a merge's swap or a GC pass holds the index's manifest: a checkpoint now
        would wait for it (a merge's reads and writes hold only ``rewrite_lock``)."""
        return self.index.publish_lock.locked()


def replay_from(rec: SegmentRecord, mark: list[int]) -> int | None:
    """How many of ``rec``'s rows the runs cover, by the manifest's ``mark`` (the replay
    applies the rest), or None for a segment below the mark. An active segment is never below
    it: a manifest published before the mark kept to the active rows (``_mark_between``) may
    lie past one that took rows since — it is replayed whole (an entry applied twice is the
    same version, which reads and merges take once)."""
    if rec.seq < mark[2]:
        return 0 if rec.state == SegState.ACTIVE else None
    return mark[1] if rec.seq == mark[2] else 0


def segment_states(recs: list[SegmentRecord]) -> dict[str, int]:
    out = {s.value: 0 for s in SegState}
    for r in recs:
        out[r.state.value] += 1
    return out
