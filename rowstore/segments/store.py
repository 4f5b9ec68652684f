"""The segment table and the segment life cycle: create, append, seal, offload, read.

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
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from catalog.abc import Check, Delete, Entry, Op, Put
from rowstore.codec.rows import Decoded, decode_rows
from rowstore.errors import DanglingRowidError, RowstoreError, SegmentNotFoundError, UnavailableError
from rowstore.rowids import split_rowids
from rowstore.schema import SchemaVersion
from rowstore.segments.active import ActiveSegment
from rowstore.segments.columnar import ColumnarSegment, SealedReader, open_segment
from rowstore.segments.columnar_layout import BLOCK_SIZE
from rowstore.segments.columnar_write import columnar_bytes
from rowstore.segments.handover import Handover
from rowstore.segments.records import PENDING_PREFIX as PENDING_PREFIX  # re-exported: the segment table's names
from rowstore.segments.records import SEG_PREFIX as SEG_PREFIX
from rowstore.segments.records import SegmentRecord as SegmentRecord
from rowstore.segments.records import SegState as SegState
from rowstore.segments.sealed import ClusterRange, sealed_bytes
from terrafs.catalog_ops import commit
from terrafs.errors import CatalogConflictError, ClosedError, MirrorError, NoSpaceError, TerrafsError, failed_error
from terrafs.fs import TerrascaleFS
from terrafs.ranges import RangeAllocator
from terrafs.records import FileRecord

T = TypeVar("T")
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


class SegmentStore(Handover):
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
        self.segids = RangeAllocator(self.catalog, "rs", 1, 2**32 - 1)
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
            seq = 1 + max((r.seq for r in await self.list(table=table) if r.partition == partition), default=0)
        sh = self.shippers.get((table, partition))
        for _ in range(100):
            guard = await sh.lead_checks() if sh is not None else []  # its epoch still the newest
            segid, checks, ops = await self.segids.reserve()
            rec = SegmentRecord(segid, table, partition, SegState.ACTIVE, self.node, 0, seq=seq,
                                epoch=self.epochs.get((table, partition), 0))

            def extra(f: FileRecord, rec: SegmentRecord = rec, checks: Sequence[Check] = (*checks, *guard),
                      ops: Sequence[Op] = ops) -> tuple[builtins.list[Check], builtins.list[Op]]:
                row = replace(rec, inode=f.inode)
                return [*checks, Check(row.key, 0)], [*ops, Put(row.key, row.to_bytes())]

            try:
                af = await self.fs.create(extra=extra)
            except CatalogConflictError:
                continue  # another allocator took this segid range row first
            seg = ActiveSegment(segid, af, af.where)
            seg.seq = seq
            self.active[segid] = seg
            self._parts[segid] = (table, partition)
            sh = self.shippers.get((table, partition))
            if sh is not None:
                sh.register(seq, seg)
            return seg
        raise RowstoreError("could not allocate a segment id")

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

    async def create_copy(self, table: str, partition: int, content: Callable[[int], AsyncIterable[bytes]],
                          columnar: bool = False) -> SegmentRecord:
        """A garbage collector's copy (RFC 0009): the object, its file row, a reserved segid and
        a pending row ``gc/pending/<segid>`` in ONE transaction. The segment row is written
        only by the pass's publishing transaction (:meth:`published_ops`); until then the copy
        is invisible and recovery (:meth:`drop_pending`) deletes it."""
        for _ in range(100):
            segid, checks, ops = await self.segids.reserve()
            key = f"{PENDING_PREFIX}{segid:08x}"
            pend = {"segid": segid, "table": table, "partition": partition, "owner": self.node}

            def extra(f: FileRecord, key: str = key, pend: dict[str, Any] = pend, checks: Sequence[Check] = checks,
                      ops: Sequence[Op] = ops) -> tuple[builtins.list[Check], builtins.list[Op]]:
                return [*checks, Check(key, 0)], [*ops, Put(key, json.dumps(dict(pend, inode=f.inode)).encode())]

            try:
                f = await self.fs.create_sealed(content(segid), extra=extra,
                                                block_size=BLOCK_SIZE if columnar else None)
            except CatalogConflictError:
                continue  # another allocator took this segid range row first (the copy is rebuilt)
            return SegmentRecord(segid, table, partition, SegState.OFFLOADED, self.node, f.inode,
                                 bytes=f.size, live_bytes=f.size, location=f.location, format=2 if columnar else 1)
        raise RowstoreError("could not allocate a segment id for a copy")

    async def drop_pending(self) -> builtins.list[int]:
        """Delete this node's unpublished copies (a pass that crashed before publishing)."""
        gone: builtins.list[int] = []
        for e in await self.catalog.scan(PENDING_PREFIX):
            p = json.loads(e.value)
            if p["owner"] != self.node:
                continue
            try:  # the segid is not returned (docs/format/segment.md §6)
                await self.fs.delete(p["inode"], [Check(e.key, e.version)], [Delete(e.key)])
            except CatalogConflictError:
                continue
            gone.append(p["segid"])
            log.info("event=gc_pending_dropped segid=%d inode=%d", p["segid"], p["inode"])
        return gone

    async def superseded(self, rowids: np.ndarray) -> None:
        """Row versions an index merge purged: their segments' ``live_rows``/``live_bytes`` go
        down now (a garbage-collection pass recounts them all; a conflict is left to it)."""
        segs, _ = split_rowids(rowids)
        ids, counts = np.unique(segs, return_counts=True)
        for segid, n in zip(ids.tolist(), counts.tolist()):
            e = await self.catalog.get(f"{SEG_PREFIX}{segid:08x}")
            if e is None:
                continue
            rec = SegmentRecord.from_bytes(e.value)
            if rec.state not in (SegState.SEALED, SegState.OFFLOADED) or not rec.rows:
                continue  # an active segment's counts are set at seal; a retired one's are 0
            live = max(rec.live_rows - n, 0)
            upd = replace(rec, live_rows=live, live_bytes=rec.bytes * live // rec.rows)
            await commit(self.catalog, [Check(e.key, e.version)], [Put(e.key, upd.to_bytes())])

    async def clusters(self, segids: Collection[int]) -> dict[int, ClusterRange | None]:
        """segid -> its cluster range (None: none), for query pruning; one catalog scan when a
        segid is new to this node (a segid's range never changes until it is deleted)."""
        if any(s not in self._clusters for s in segids):
            for r in await self.list():
                if r.state != SegState.ACTIVE:
                    self._clusters[r.segid] = tuple(r.cluster) if r.cluster else None
            for s in segids:
                self._clusters.setdefault(s, None)
        return self._clusters

    async def scan(self, segid: int, target: SchemaVersion,
                   schemas: Callable[[int], SchemaVersion] | None = None) -> AsyncIterator[Decoded]:
        """Every row of a segment in localid order, as decoded Arrow batches."""
        schemas = self._schemas(schemas)
        seg = self.active.get(segid)
        if seg is not None:
            try:
                async for b in seg.batches():
                    yield decode_rows(b.rows, b.starts, schemas, target, seg.where)
            except ClosedError as e:  # released meanwhile: its partition moved to another leader
                raise UnavailableError(f"segment {segid} is no longer open here (its partition moved); "
                                       "retry") from e
        else:
            async for d in (await self.sealed(segid)).scan(schemas, target):
                yield d

    def _schemas(self, given: Callable[[int], SchemaVersion] | None) -> Callable[[int], SchemaVersion]:
        """The lookup rows are decoded with: the caller's, else the store's own."""
        if given is None and self.schemas is None:
            raise RowstoreError("this segment store decodes rows with their table's schema lookup only; pass it")
        got = given or self.schemas
        assert got is not None  # (checked above)
        return got

    async def sealed(self, segid: int) -> SealedReader:
        s = self._sealed.get(segid)
        if s is None:
            rec, _ = await self.record(segid)
            if rec.state not in (SegState.OFFLOADED, SegState.RETIRED):  # retired: readable until deleted
                if (rec.table, rec.partition) in self.not_led:  # a read begun before it stopped leading
                    raise UnavailableError(f"partition {rec.partition} is no longer led by this node (its "
                                           f"{rec.state.value} segment {segid} was released during the read); retry")
                raise RowstoreError(f"segment {segid} is {rec.state.value}, not offloaded")
            s = self._sealed[segid] = await open_segment(await self.fs.open_sealed(rec.inode))
        return s

    async def columnar_segments(self, segids: Collection[int]) -> dict[int, ColumnarSegment]:
        """The offloaded columnar segments among ``segids``, opened (their metadata read once):
        what reads skip groups of rows with. Others (active, row-wise, gone) are left out."""
        out: dict[int, ColumnarSegment] = {}
        for s in segids:
            seg = self._sealed.get(s)
            if seg is None and s not in self.active:
                try:
                    seg = await self.sealed(s)
                except (RowstoreError, TerrafsError):
                    continue  # not offloaded (sealed on its way, retired and gone): nothing to skip with
            if isinstance(seg, ColumnarSegment):
                out[s] = seg
        return out

    def row_bytes_cached(self, rowid: int) -> tuple[bytes, str] | None:
        """``row_bytes`` without I/O: when the memory cache holds the row's block (and, for an
        offloaded segment, the tree pages on its path are parsed already); else None."""
        seg: ActiveSegment | SealedReader | None
        seg = self.active.get(rowid >> 32)
        rows = seg.durable_rows if seg is not None else 0
        if seg is None:
            seg = self._sealed.get(rowid >> 32)
            rows = seg.footer.rows if seg is not None else 0
        if seg is None or (rowid & 0xFFFFFFFF) >= rows:
            return None  # (a localid past the end: row_bytes reports it)
        if isinstance(seg, ColumnarSegment):
            raw = seg.row_bytes_cached(rowid & 0xFFFFFFFF)
        else:
            raw = seg.get_raw_cached(rowid & 0xFFFFFFFF)
        return None if raw is None else (raw, seg.where)

    def row_cached(self, rowid: int, target: SchemaVersion,
                   decode: Callable[[bytes, str], dict[str, Any]]) -> dict[str, Any] | None:
        """One row as a dict of ``target``'s columns without I/O (None: something must be read).
        Row bytes are decoded by ``decode`` (the point decoders); a columnar segment's row is
        taken from its decoded pages."""
        seg = self._sealed.get(rowid >> 32)
        if isinstance(seg, ColumnarSegment) and rowid >> 32 not in self.active:
            loc = rowid & 0xFFFFFFFF
            return seg.row_cached(loc, target) if loc < seg.footer.rows else None
        got = self.row_bytes_cached(rowid)
        return None if got is None else decode(*got)

    async def row(self, rowid: int, target: SchemaVersion, decode: Callable[[bytes, str], dict[str, Any]],
                  where: str = "") -> dict[str, Any]:
        """``row_cached``, reading what it needs; a rowid no segment holds is DanglingRowidError."""
        got = self.row_cached(rowid, target, decode)
        if got is not None:
            return got
        if rowid >> 32 not in self.active:
            try:
                seg = await self.sealed(rowid >> 32)
            except SegmentNotFoundError:
                seg = None  # row_bytes says so, naming where
            except RowstoreError:
                seg = None  # not offloaded (yet): an active segment's row, read below
            if isinstance(seg, ColumnarSegment):
                loc = rowid & 0xFFFFFFFF
                if loc >= seg.footer.rows:
                    raise DanglingRowidError(where or seg.where, rowid, f"the segment has {seg.footer.rows} rows")
                return await seg.row(loc, target)
        return decode(*await self.row_bytes(rowid, where))

    async def read_active(self, segid: int, read: Callable[[ActiveSegment], Awaitable[T]]) -> T | None:
        """``read(seg)`` of segment ``segid`` while it is active here; None when it is not, or
        when it stopped being active during the read (sealed, offloaded, or its partition
        released: the file closed or removed under the read) — the caller reads its sealed
        object then. Any other failure, or a storage failure of a segment still active, is
        raised: it is not a segment changing state."""
        seg = self.active.get(segid)
        if seg is None:
            return None
        try:
            return await read(seg)
        except (TerrafsError, OSError):
            if segid in self.active:
                raise
            return None

    async def row_bytes(self, rowid: int, where: str = "") -> tuple[bytes, str]:
        """One row's encoded bytes and where they came from (for a point read); a rowid no
        segment holds is DanglingRowidError naming ``where`` (the table and partition)."""
        segid, loc = rowid >> 32, rowid & 0xFFFFFFFF

        async def from_active(seg: ActiveSegment) -> tuple[bytes, str]:
            if loc >= seg.durable_rows:
                raise DanglingRowidError(where or seg.where, rowid, f"the active segment has {seg.durable_rows} rows")
            return await seg.get_raw(loc), seg.where

        got = await self.read_active(segid, from_active)
        if got is not None:
            return got
        try:
            sealed = await self.sealed(segid)
        except SegmentNotFoundError:
            raise DanglingRowidError(where or f"segment {segid}", rowid, "no such segment exists") from None
        if loc >= sealed.footer.rows:
            raise DanglingRowidError(where or sealed.where, rowid, f"the segment has {sealed.footer.rows} rows")
        if isinstance(sealed, ColumnarSegment):
            return await sealed.row_bytes(loc), sealed.where
        return await sealed.get_raw(loc), sealed.where

    async def get(self, ids: np.ndarray, target: SchemaVersion,
                  schemas: Callable[[int], SchemaVersion] | None = None) -> Decoded:
        """Rows by rowid (all in one segment), from its active file or its object."""
        schemas = self._schemas(schemas)
        segs, locs = split_rowids(np.atleast_1d(ids))
        if len(set(segs.tolist())) != 1:
            raise RowstoreError("get() takes rowids of one segment")
        segid = int(segs[0])
        seg = self.active.get(segid)
        if seg is not None:
            return await seg.get(locs, schemas, target)
        sealed = await self.sealed(segid)
        if isinstance(sealed, ColumnarSegment):  # rows in the order asked
            order = np.argsort(locs, kind="stable")
            d = await sealed.take(locs[order].astype(np.int64), target)
            back = np.empty_like(order)
            back[order] = np.arange(len(order))
            return Decoded(d.batch.take(pa.array(back)), d.commit_ts[back], d.deleted[back], d.schema_ver[back])
        return await sealed.get(locs, schemas, target)


def _refuse_failed(seg: ActiveSegment) -> None:
    """A segment that stopped at the device (full, or a disk error) is not sealed (sealing
    writes, and its tail is cut when it is revived): it stays the partition's current one
    until then."""
    f = seg.file.failure
    if isinstance(f, NoSpaceError):
        raise NoSpaceError(f"segment {seg.segid}: {f}")
    if f is not None and not isinstance(f, MirrorError):
        raise failed_error(f"segment {seg.segid}", f)
