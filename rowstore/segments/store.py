"""The segment table and the segment life cycle: create, append, seal, offload, delete. Its
reads (``store_reads.py``), the garbage collector's copies (``store_gc.py``) and hand-overs
between leaders (``handover.py``) are mixed in.

Catalog rows ``rs/seg/<segid:08x>`` hold the segment's table, partition,
state, owner, TerrascaleFS inode and statistics. Segids come from a free-range
table (``rs/free/…``, the inode algorithm). Every state change of a segment
is in the same catalog transaction as the change of its file, so the two
never disagree after a crash.

    create ──> ACTIVE ──seal──> SEALED ──offload──> OFFLOADED ──(GC)──> RETIRED
"""
from __future__ import annotations

import asyncio
import builtins
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from catalog.abc import Check, Delete, Entry, Op, Put
from catalog.errors import CatalogError
from rowstore.errors import RowstoreError, SegmentNotFoundError, UnavailableError
from rowstore.schema import SchemaVersion
from rowstore.segments.active import ActiveSegment
from rowstore.segments.columnar import SealedReader
from rowstore.segments.columnar_layout import BLOCK_SIZE
from rowstore.segments.columnar_write import columnar_bytes
from rowstore.segments.handover import Handover
from rowstore.segments.records import PENDING_PREFIX as PENDING_PREFIX  # re-exported: the segment table's names
from rowstore.segments.records import SEG_PREFIX as SEG_PREFIX
from rowstore.segments.records import SegmentRecord as SegmentRecord
from rowstore.segments.records import SegState as SegState
from rowstore.segments.records import seq_floor_key
from rowstore.segments.sealed import ClusterRange, sealed_bytes
from rowstore.segments.store_gc import CopyForward
from rowstore.segments.store_reads import SegmentReads
from terrafs.errors import (CatalogConflictError, MirrorError, NoSpaceError, StorageIOError, TerrafsError,
                            failed_error)
from terrafs.fs import TerrascaleFS
from terrafs.ranges import RangeAllocator
from terrafs.records import FileRecord

log = logging.getLogger("rowstore.segments.store")


class Decider(Protocol):
    """Whether a prepared batch committed (``Committer.decide_at_recovery``); ``keep``: the
    catalog keeps the decision (a replicated partition's copy that leads next needs it)."""

    def __call__(self, txn: int, keep: bool = ...) -> Awaitable[bool]: ...


class SegmentShipper(Protocol):
    """What a replicated partition led here is told of its segments (rowstore.replication's
    ``Shipper``)."""

    def register(self, seq: int, seg: ActiveSegment) -> None: ...

    def unregister(self, segid: int) -> None: ...

    async def lead_checks(self) -> Sequence[Check]: ...


class SegmentStore(Handover, SegmentReads, CopyForward):
    """One node's view of the row store: its active segments and every sealed one."""

    def __init__(self, fs: TerrascaleFS, schemas: Callable[[int], SchemaVersion] | None = None,
                 seal_bytes: int = 256 << 20, lost: frozenset[int] = frozenset(), columnar: bool = False) -> None:
        """``schemas``: version id -> SchemaVersion, for reads that pass none. A node's store has
        none: its tables each have their own history, and every read passes that table's.
        ``lost``: inodes the file system's recovery found gone or recreated empty. ``columnar``:
        offload (and the collector's copies) write version 2, columnar (docs/format/segment.md §7)."""
        self.fs, self.catalog = fs, fs.catalog
        self.schemas = schemas
        self.seal_bytes = seal_bytes
        self.columnar = columnar
        self._current: dict[tuple[str, int], ActiveSegment] = {}
        self._rolling: dict[tuple[str, int], asyncio.Lock] = {}
        self.node = fs.cfg.node_id
        self.segids = RangeAllocator(self.catalog, "rs", 1, 2**32 - 1, rng=fs.entropy.jitter())
        self.active: dict[int, ActiveSegment] = {}
        self._sealed: dict[int, SealedReader] = {}
        self._clusters: dict[int, ClusterRange | None] = {}  # segid -> cluster range (immutable per segid)
        self.shippers: dict[tuple[str, int], SegmentShipper] = {}  # replicated partitions led here
        self._parts: dict[int, tuple[str, int]] = {}  # segid -> (table, partition) of open segments

        self.epochs: dict[tuple[str, int], int] = {}  # their epochs (new segment rows carry it)
        self.lost: set[int] = set(lost)  # inodes whose local files were gone at start (a lost block device)
        self.not_led: set[tuple[str, int]] = set()  # replicated partitions this node stopped leading

    async def open(self, decide: Decider | None = None) -> list[int]:
        """Init the segid table; reopen this node's local segments; finish pending offloads
        is left to the caller (it needs the key schema); returns segids still to offload.

        ``decide(txn)`` answers for a segment ending in a prepared batch (RFC 0003)."""
        await self.segids.init()
        self._decide = decide
        pending: list[int] = []
        for rec in await self.list(owner=self.node):
            if rec.epoch > 0 and rec.inode in self.lost:
                continue  # this node's copy of a replicated partition's log is gone: it holds nothing
            if rec.state in (SegState.ACTIVE, SegState.SEALED):
                # A replicated partition's segment (epoch > 0) is one copy of its log: the
                # catalog keeps the decisions taken here for the copy that leads it next.
                dec: Callable[[int], Awaitable[bool]] | None = \
                    decide if decide is None or rec.epoch == 0 else (lambda txn: decide(txn, keep=True))
                self.active[rec.segid] = await ActiveSegment.recover(
                    rec.segid, await self.fs.open_active(rec.inode), dec)
                self.active[rec.segid].seq = rec.seq
                self._parts[rec.segid] = (rec.table, rec.partition)

            if rec.epoch > 0:  # replicated: this node appends to it only once it leads it again (adopt)
                self.not_led.add((rec.table, rec.partition))
            elif rec.state == SegState.ACTIVE:
                self._current[(rec.table, rec.partition)] = self.active[rec.segid]
            if rec.state == SegState.SEALED:
                pending.append(rec.segid)
        return pending

    def live(self, rec: SegmentRecord) -> SegmentRecord:
        """``rec`` as this node sees it now: a segment whose bytes are here reports its commit
        timestamps so far, and an active one its durable rows and bytes (its catalog row gets
        them when it is sealed). An empty active segment has ``max_ts`` 0."""
        seg = self.active.get(rec.segid)
        if seg is None:
            return rec
        live = replace(rec, min_ts=seg.min_ts or 0, max_ts=seg.max_ts or 0)
        if rec.state is SegState.ACTIVE:
            live = replace(live, rows=seg.durable_rows, bytes=seg.nbytes, live_rows=seg.durable_rows,
                           live_bytes=seg.nbytes)
        return live

    def flush_stats(self) -> list[dict[str, float]]:
        """Each local active file's group-commit counters (flushes, bytes, appends, seconds)."""
        return [seg.file.stats for seg in list(self.active.values())]

    async def list(self, owner: str | None = None, table: str | None = None) -> list[SegmentRecord]:
        recs = [SegmentRecord.from_bytes(e.value) for e in await self.catalog.scan(SEG_PREFIX)]
        return [r for r in recs if (owner is None or r.owner == owner) and (table is None or r.table == table)]

    async def next_seq(self, table: str, partition: int) -> int:
        """One above the partition's highest ``seq``: its segment rows', or the one the garbage
        collector kept when it retired the segment that held it (RFC 0009, "Replay order").
        The rows are read first: the retire that writes the floor precedes the row's delete."""
        top = max((r.seq for r in await self.list(table=table) if r.partition == partition), default=0)
        e = await self.catalog.get(seq_floor_key(table, partition))
        return 1 + max(top, 0 if e is None else int(json.loads(e.value)["seq"]))

    def seq_floor_op(self, table: str, partition: int, seq: int) -> Put:
        """The write that keeps ``seq`` as the partition's highest once its segment row goes."""
        return Put(seq_floor_key(table, partition), json.dumps({"seq": seq}).encode())

    async def record(self, segid: int) -> tuple[SegmentRecord, Entry]:
        e = await self.catalog.get(f"{SEG_PREFIX}{segid:08x}")
        if e is None:
            raise SegmentNotFoundError(f"no segment {segid}")
        return SegmentRecord.from_bytes(e.value), e

    async def create(self, table: str, partition: int, seq: int | None = None) -> ActiveSegment:
        """A new active segment: inode, file row, segid and segment row in ONE transaction.
        Never for a replicated partition this node stopped leading (its log is the leader's)."""
        if (table, partition) in self.not_led:
            raise UnavailableError(f"partition {partition} is no longer led by this node; retry")
        if seq is None:
            seq = await self.next_seq(table, partition)
        sh = self.shippers.get((table, partition))
        for _ in range(100):
            guard = await sh.lead_checks() if sh is not None else []  # its epoch still the newest
            segid, checks, ops = await self.segids.reserve()
            rec = SegmentRecord(segid, table, partition, SegState.ACTIVE, self.node, 0, seq=seq,
                                epoch=self.epochs.get((table, partition), 0))

            made: builtins.list[int] = []  # the inode the creating transaction named

            def extra(f: FileRecord, rec: SegmentRecord = rec, checks: Sequence[Check] = (*checks, *guard),
                      ops: Sequence[Op] = ops, made: builtins.list[int] = made
                      ) -> tuple[builtins.list[Check], builtins.list[Op]]:
                row = replace(rec, inode=f.inode)
                made[:] = [f.inode]
                return [*checks, Check(row.key, 0)], [*ops, Put(row.key, row.to_bytes())]

            try:
                af = await self.fs.create(extra=extra)
            except CatalogConflictError:
                continue  # another allocator took this segid range row first
            except StorageIOError:
                await self._forget_created(made, rec.key)
                raise
            seg = ActiveSegment(segid, af, af.where)
            seg.seq = seq
            self.active[segid] = seg
            self._parts[segid] = (table, partition)
            sh = self.shippers.get((table, partition))
            if sh is not None:
                sh.register(seq, seg)
            return seg
        raise RowstoreError("could not allocate a segment id")

    async def _forget_created(self, made: builtins.list[int], key: str) -> None:
        """The rows of a segment whose file the disk refused after its creating transaction:
        gone again, so that a disk failing every create does not leave a row per attempt (an
        adoption moves every active row in one transaction: simulation seed 70455 piled up 164
        of them and no promotion fit the catalog's limit). Best effort: a row left stays the
        empty segment it was (docs/format/index-run.md: the mark stops at it)."""
        if not made:
            return
        try:
            await self.fs.delete(made[0], [], [Delete(key)])
        except (TerrafsError, CatalogError, OSError) as e:
            log.warning("event=created_segment_left inode=%d error=%r", made[0], e)

    async def append(self, table: str, partition: int, batch: pa.RecordBatch, schema: SchemaVersion, commit_ts: int,
                     deleted: np.ndarray | None = None) -> np.ndarray:
        """Append to the partition's current segment; roll over once it reaches ``seal_bytes``.

        The full segment is sealed and a new one takes over; offloading it is
        the offloader's job (``pending_offload``)."""
        seg = await self.current(table, partition)
        ids = await seg.append(batch, schema, commit_ts, deleted)
        if seg.nbytes >= self.seal_bytes:
            await self._roll(table, partition, seg)
        return ids

    def current_or_none(self, table: str, partition: int) -> ActiveSegment | None:
        """The partition's segment taking appends now, without creating one."""
        return self._current.get((table, partition))

    async def current(self, table: str, partition: int) -> ActiveSegment:
        seg = self._current.get((table, partition))
        if seg is None:
            async with self._rolling.setdefault((table, partition), asyncio.Lock()):
                seg = self._current.get((table, partition))
                if seg is None:
                    seg = self._current[(table, partition)] = await self.create(table, partition)
        return seg

    def failed_for_space(self) -> builtins.list[tuple[str, int]]:
        """The partitions whose current segment stopped at a full block device."""
        return [k for k, seg in self._current.items() if isinstance(seg.file.failure, NoSpaceError)]

    def failed(self) -> dict[tuple[str, int], BaseException]:
        """The partitions with an open segment whose file failed at the device (full, or a disk
        error) — the current one, or one whose seal failed after it stopped being current —
        and why; not those fenced as leaders (they step down already)."""
        out: dict[tuple[str, int], BaseException] = {}
        for seg in self._failed_segments():
            assert seg.file.failure is not None  # what _failed_segments picks
            out.setdefault(self._parts[seg.segid], seg.file.failure)
        return out

    def _failed_segments(self, key: tuple[str, int] | None = None) -> builtins.list[ActiveSegment]:
        return [seg for segid, seg in self.active.items() if segid in self._parts
                and (key is None or self._parts[segid] == key)
                and seg.file.failure is not None and not isinstance(seg.file.failure, MirrorError)]

    async def revive(self, table: str, partition: int) -> bool:
        """Take writes again on a partition whose segments stopped at the device (full, or a
        disk error; the caller saw space come back, and holds the partition's writer lock
        with nothing in flight): each failed file is cut back to its last durable group and
        recovered from the device, so its localids are the file's again (the failed batches'
        are handed out anew; prepared tails are decided), and one that is no longer current
        is sealed, as it would have been. Raises, the file left as it is, while the device
        still fails the cut."""
        key = (table, partition)
        failed = self._failed_segments(key)
        for seg in failed:
            new = await ActiveSegment.recover(seg.segid, await self.fs.reopen_failed(seg.file), self._decide)
            new.seq = seg.seq
            self.active[seg.segid] = new
            if self._current.get(key) is seg:
                self._current[key] = new
            else:
                await self.seal(seg.segid)
            log.warning("event=segment_revived segid=%d rows=%d bytes=%d", seg.segid, new.durable_rows, new.nbytes)
        return bool(failed)

    async def roll(self, table: str, partition: int, empty: bool = False) -> ActiveSegment | None:
        """Seal the partition's current segment now (if it holds rows, or ``empty`` too); a new
        one takes over at the next append. Returns the sealed segment."""
        seg = self._current.get((table, partition))
        if seg is None or (seg.durable_rows == 0 and not empty):
            return None
        _refuse_failed(seg)
        key = (table, partition)
        async with self._rolling.setdefault(key, asyncio.Lock()):
            if self._current.get(key) is not seg:
                return None
            del self._current[key]
        try:
            await self.seal(seg.segid)
        except BaseException:
            if key not in self._current and seg.segid in self.active:  # not sealed: it stays the current one
                self._current[key] = seg  # (a failed file then refuses appends; revived or stepped down from)
            raise
        log.info("event=segment_sealed segid=%d bytes=%d rows=%d", seg.segid, seg.nbytes, seg.durable_rows)
        return seg

    async def _roll(self, table: str, partition: int, full: ActiveSegment) -> None:
        _refuse_failed(full)
        async with self._rolling.setdefault((table, partition), asyncio.Lock()):
            if self._current.get((table, partition)) is not full:
                return  # another appender rolled it already
            self._current[(table, partition)] = await self.create(table, partition)
        await self.seal(full.segid)
        log.info("event=segment_sealed segid=%d bytes=%d rows=%d", full.segid, full.nbytes, full.durable_rows)

    async def pending_offload(self) -> builtins.list[int]:
        """This node's sealed segments still on its block device and open here (not those of a
        replicated partition it stopped leading: its files were released, the next leader
        offloads its own copy)."""
        return [r.segid for r in await self.list(owner=self.node)
                if r.state == SegState.SEALED and r.inode not in self.lost and r.segid in self.active]

    async def seal(self, segid: int) -> SegmentRecord:
        rec, e = await self.record(segid)
        if rec.state != SegState.ACTIVE:
            return rec
        seg = self._open_here(segid)
        await seg.file.flush()  # a lazy record (a COMMIT, a PROGRESS) still buffered counts too
        new = replace(rec, state=SegState.SEALED, rows=seg.durable_rows, bytes=seg.nbytes,
                      min_ts=seg.min_ts or 0, max_ts=seg.max_ts or 0, live_rows=seg.durable_rows,
                      live_bytes=seg.nbytes)
        await self.fs.seal(rec.inode, extra=lambda _f: ([Check(e.key, e.version)], [Put(e.key, new.to_bytes())]))
        return new

    def _open_here(self, segid: int) -> ActiveSegment:
        """The open segment ``segid``; unavailable once this node released it meanwhile (its
        partition moved to another leader while a seal or an offload of it was on its way)."""
        seg = self.active.get(segid)
        if seg is None:
            raise UnavailableError(f"segment {segid} is no longer open here (its partition moved); retry")
        return seg

    async def offload(self, segid: int, key_schema: SchemaVersion,
                      schemas: Callable[[int], SchemaVersion] | None = None) -> SegmentRecord:
        """Rewrite the sealed segment as an object (rows + B+ tree + footer), switch, drop local."""
        rec, e = await self.record(segid)
        if rec.state == SegState.OFFLOADED:
            return rec
        if rec.state != SegState.SEALED:
            raise RowstoreError(f"segment {segid} is {rec.state.value}; seal it first")
        seg = self._open_here(segid)
        stats: dict[str, Any] = {}

        def extra(f: FileRecord) -> tuple[builtins.list[Check], builtins.list[Op]]:
            new = replace(rec, state=SegState.OFFLOADED, bytes=f.size, live_bytes=f.size, location=f.location,
                          deletions=stats.get("deletions", 0), deletions_max_ts=stats.get("deletions_max_ts", 0),
                          format=stats.get("format", 1))
            return [Check(e.key, e.version)], [Put(e.key, new.to_bytes())]

        write = columnar_bytes if self.columnar else sealed_bytes
        await self.fs.offload(rec.inode, write(segid, seg.batches(), self._schemas(schemas), key_schema, stats),
                              extra=extra, block_size=BLOCK_SIZE if self.columnar else None)
        self.active.pop(segid, None)
        sh = self.shippers.get((rec.table, rec.partition))
        if sh is not None:
            sh.unregister(segid)
        log.info("event=segment_offloaded segid=%d rows=%s", segid, stats.get("rows"))
        return (await self.record(segid))[0]

    async def delete(self, segid: int) -> bool:
        """Drop a segment: its row and its file in one transaction, then the bytes (the garbage
        collector calls this). The segid is never returned to the free table: nothing may ever
        name another segment with it (docs/format/segment.md §6). False when the segment is
        gone already."""
        for _ in range(100):
            e = await self.catalog.get(f"{SEG_PREFIX}{segid:08x}")
            if e is None:
                return False
            rec = SegmentRecord.from_bytes(e.value)
            try:
                await self.fs.delete(rec.inode, [Check(e.key, e.version)], [Delete(e.key)])
                break
            except CatalogConflictError:
                continue  # the row changed (its live counts); read it again
        else:
            raise RowstoreError(f"could not delete segment {segid}")
        self.active.pop(segid, None)
        self._sealed.pop(segid, None)
        self._clusters.pop(segid, None)
        for k, seg in list(self._current.items()):
            if seg.segid == segid:
                del self._current[k]
        return True


def _refuse_failed(seg: ActiveSegment) -> None:
    """A segment that stopped at the device (full, or a disk error) is not sealed (sealing
    writes, and its tail is cut when it is revived): it stays the partition's current one
    until then."""
    f = seg.file.failure
    if isinstance(f, NoSpaceError):
        raise NoSpaceError(f"segment {seg.segid}: {f}")
    if f is not None and not isinstance(f, MirrorError):
        raise failed_error(f"segment {seg.segid}", f)
