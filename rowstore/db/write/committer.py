"""Writes: a batch split by key hash into its partitions, committed with one ``BATCH …
COMMIT`` append when it touches one partition, or with the two-phase commit of RFC 0003
when it touches several — queued per table and committed as one group, whose commit point
is one catalog transaction (``txn/<id>``; :mod:`rowstore.db.write.two_phase`)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import numpy as np
import pyarrow as pa

from catalog.abc import Catalog
from rowstore.errors import UnavailableError
from rowstore.tables.keys import encode_columns, key_arrays, partitions_of
from rowstore.codec.rows import Encoded
from rowstore.schema import Column, SchemaVersion
from rowstore.rowids import split_rowids
from rowstore.segments.active import ActiveSegment
from rowstore.tables.conform import PartitionShare, conform, split_by_partition, stamp
from rowstore.tables.key_check import check_key_columns, check_key_lists
from rowstore.tables.definitions import TableCatalog, TableDef
from rowstore.db.changes import CommitTail
from rowstore.db.partition import Partition
from rowstore.timeline import Timeline
from rowstore.db.registry import Table, TableRegistry
from rowstore.db.tasks import BackgroundTasks
from rowstore.db.write.two_phase import TwoPhaseCommit, deleted_of
from terrafs.entropy import SYSTEM, Entropy

T = TypeVar("T")
# Bigger batches are sorted, split and encoded in a worker thread. Up to this size that is
# ~1.5 ms of CPU on the event loop, which costs less than the worker's GIL hand-offs: each
# of its numpy/Arrow/numba calls releases the GIL and may wait for it again behind the loop
# (10k-row batches, 4 clients: 0.95M -> 1.22M rows/s, medians of 8 alternating runs).
THREAD_ROWS = 16_384


@dataclass(frozen=True)
class WriteResult:
    count: int
    commit_ts: int


class Committer(TwoPhaseCommit):
    """A node's writes: checked, split by partition, committed (one partition here; several:
    :class:`TwoPhaseCommit`), applied to the indexes and acknowledged once visible."""

    def __init__(self, catalog: Catalog, definitions: TableCatalog, tables: TableRegistry, timeline: Timeline,
                 tasks: BackgroundTasks, step_down: Callable[[str, int], Coroutine[Any, Any, bool]],
                 tail: CommitTail, ack_timeout_s: float = 10.0, entropy: Entropy = SYSTEM,
                 room: Callable[[], Awaitable[None]] | None = None):
        """``step_down(table id, pid)``: the leader of a replicated partition whose write missed
        its ack timeout steps down (started in the background, :meth:`_bounded`). ``tail``: every
        applied batch is handed to it before its timestamp ends (subscriptions, RFC 0015).
        ``entropy``: where transaction ids are drawn. ``room()``: awaited before each write (the
        memtables' write stall, ``Maintenance.room``)."""
        self.catalog, self.definitions, self.tables, self.tail = catalog, definitions, tables, tail
        self.entropy = entropy
        self.timeline, self.tasks, self.step_down = timeline, tasks, step_down
        self._decided = []  # txn keys decided committed at recovery
        self._groups = {}  # table id -> multi-partition batches waiting to commit
        self._leading = set()  # table ids whose group committer is running
        self._applying = {}  # table id -> its last decided group's finish
        # A write to a replicated partition waits this long for a majority of its replicas, then
        # answers "unavailable" (the batch may still become durable and visible later).
        self.ack_timeout_s = ack_timeout_s
        # awaited before every write: returns at once unless the memtables are far over their
        # budget (Maintenance.room: the write then waits for a checkpoint)
        self.room = room

    # -- writes -------------------------------------------------------------------------------

    async def upsert(self, name: str, data: pa.RecordBatch | pa.Table) -> WriteResult:
        """Insert or replace rows by primary key, atomically; returns once durable and visible."""
        d = await self.definitions.describe(name)
        assert d.schema is not None  # describe() refuses a dropped table
        return await self.write(d, conform(data, d.schema), None)

    async def delete(self, name: str, keys: Sequence[object] | pa.Array) -> WriteResult:
        """Delete rows by primary key (absent keys are fine); ``count`` = keys that existed."""
        d = await self.definitions.describe(name)
        batch, deleted, existed = await self.tombstones(d, keys)
        res = await self.write(d, batch, deleted)
        return WriteResult(existed, res.commit_ts)

    async def tombstones(self, d: TableDef, keys: Sequence[object] | pa.RecordBatch | pa.Table,
                         ) -> tuple[pa.RecordBatch, np.ndarray, int]:
        """Deletion rows for ``keys`` (users' keys, or rows holding the key columns), and how
        many of the keys exist now."""
        assert d.schema is not None  # a described table: not dropped
        pk = d.schema.pk
        karrs = check_key_columns(key_arrays(pk, keys), pk) if isinstance(keys, (pa.RecordBatch, pa.Table)) \
            else check_key_lists(keys, pk)
        table = await self.tables.table(d)
        enc = encode_columns(pk, karrs)
        existed = 0
        pids = partitions_of(pk, karrs, len(table.parts), enc)
        served(table, pids)
        T = self.timeline.closed
        for p in np.unique(pids):
            existed += int(np.count_nonzero(await table.parts[p].index.get_many(enc[pids == p], T)))
        batch = tombstone_batch(d.schema, karrs)
        return batch, np.ones(batch.num_rows, bool), existed

    async def write(self, d: TableDef, batch: pa.RecordBatch, deleted: np.ndarray | None) -> WriteResult:
        if self.room is not None:
            await self.room()
        table, pieces, n = await self.split(d, batch, deleted)
        if n == 0:
            return WriteResult(0, self.timeline.closed)
        assert d.schema is not None  # split() checked it
        work = [(table.parts[p.pid], p) for p in pieces]
        ts = await (self._commit_one(*work[0], d.schema) if len(work) == 1 else
                    self._commit_many(table, work, d.schema))
        return WriteResult(n, ts)

    async def split(self, d: TableDef, batch: pa.RecordBatch,
                    deleted: np.ndarray | None) -> tuple[Table, list[PartitionShare], int]:
        """(table, the batch's pieces per partition, rows after last-wins): what committing
        needs, validated (nothing is written if a key is bad or a partition served elsewhere)."""
        assert d.schema is not None  # a described table: not dropped
        table = await self.tables.table(d)
        pk = d.schema.pk
        keys = encode_columns(pk, key_arrays(pk, batch))
        batch, keys, deleted = _last_wins(batch, keys, deleted)
        if batch.num_rows == 0:
            return table, [], 0
        pids = partitions_of(pk, key_arrays(pk, batch), len(table.parts), keys)
        served(table, pids)
        # One sort into (partition, key) order and one encode straight into it (a worker hop
        # for big batches); applying gets the key and indexed columns with each piece's row
        # positions — nothing is taken (copied) on the way.
        keep = pk.names + [c.name for c in d.schema.columns if c.id in d.indexes and c.id not in pk.ids]
        args = (batch, d.schema, keys, deleted, pids, keep)
        pieces: list[PartitionShare] = await asyncio.to_thread(split_by_partition, *args) \
            if batch.num_rows > THREAD_ROWS else split_by_partition(*args)
        return table, pieces, batch.num_rows

    @overload
    async def write_pieces(self, d: TableDef, pieces: list[PartitionShare], sizes: None = None) -> list[int]: ...

    @overload
    async def write_pieces(self, d: TableDef, pieces: list[PartitionShare],
                           sizes: list[list[int]]) -> list[list[int] | BaseException]: ...

    async def write_pieces(self, d: TableDef, pieces: list[PartitionShare],
                           sizes: list[list[int]] | None = None) -> list[int] | list[list[int] | BaseException]:
        """Commit rows already checked, encoded and split by partition (each piece: distinct
        keys, rows of ``d.schema``), without the conform/encode/split of :meth:`write` —
        for a caller that coalesced concurrent small requests (``node/http/coalesce.py``).

        Without ``sizes``: all pieces are one atomic batch with one commit timestamp; returns
        it once per piece. With ``sizes`` (per piece: its requests' row counts, back to back):
        each piece is its own atomic batch, each request in it gets its own timestamp; returns
        per piece the list of them — or the exception that failed that piece (the others
        are committed all the same)."""
        assert d.schema is not None  # the pieces were encoded with its schema
        if self.room is not None:
            await self.room()
        table = await self.tables.table(d)
        served(table, np.array([p.pid for p in pieces]))
        work = [(table.parts[p.pid], p) for p in pieces]
        if sizes is not None:
            return list(await asyncio.gather(*[self._commit_one(part, p, d.schema, n)
                                               for (part, p), n in zip(work, sizes)], return_exceptions=True))
        ts = await (self._commit_one(*work[0], d.schema) if len(work) == 1 else
                    self._commit_many(table, work, d.schema))
        return [ts] * len(work)

    async def existing(self, d: TableDef, pid: int, keys: np.ndarray) -> np.ndarray:
        """Per encoded key of partition ``pid``: whether it has a live row now (a delete's count)."""
        table = await self.tables.table(d)
        live: np.ndarray = await table.parts[pid].index.get_many(keys, self.timeline.closed) != 0
        return live

    @overload
    async def _commit_one(self, part: Partition, piece: PartitionShare, schema: SchemaVersion,
                          sizes: None = None) -> int: ...

    @overload
    async def _commit_one(self, part: Partition, piece: PartitionShare, schema: SchemaVersion,
                          sizes: list[int]) -> list[int]: ...

    async def _commit_one(self, part: Partition, piece: PartitionShare, schema: SchemaVersion,
                          sizes: list[int] | None = None) -> int | list[int]:
        """One partition's batch: one append, one group-commit wait. With ``sizes`` the piece
        holds several requests' rows back to back (:meth:`write_pieces`): each gets its own
        commit timestamp, stamped into its rows (the record's header carries the largest, as a
        two-phase group's does), and the list of them is returned."""
        async with part.lock:
            seg = await part.current()
            tss = await self.timeline.begin_many(len(sizes or (0,)))
            ts = tss[-1]
            part.enter()
            if sizes is None:
                stamp(piece.enc, ts)
            else:
                at = np.cumsum([0, *sizes]).tolist()
                for t, a, b in zip(tss, at, at[1:]):
                    stamp(Encoded(piece.enc.buf, piece.enc.starts[a:b]), t)
            task = await part.append(seg, piece.enc, ts)
        done = self._finish_one(part, seg, task, piece, schema, ts, tss, sizes)
        if (part.table_id, part.pid) not in part.store.shippers:
            return await done
        return await self._bounded(asyncio.ensure_future(done), [part])

    async def _finish_one(self, part: Partition, seg: ActiveSegment, task: asyncio.Task[np.ndarray],
                          piece: PartitionShare, schema: SchemaVersion, ts: int, tss: list[int],
                          sizes: list[int] | None) -> int | list[int]:
        try:
            ids = await task
            if sizes is not None:
                seg.note_commit_ts(tss[0])
            row_ts: int | np.ndarray = ts if sizes is None else np.repeat(np.array(tss, np.uint64), sizes)
            part.apply(split_rowids(ids)[1], seg.segid, piece.batch, row_ts, deleted_of(piece), schema, piece.keys,
                       piece.pos)
            self.tail.committed(part.table_id, part.pid, piece.enc, tss[-1])
            self.merge_if_due(part)
        finally:
            part.leave()
            for t in tss:
                self.timeline.end(t)
        await self.timeline.wait_closed(ts)
        if part.full():
            self.tasks.spawn(part.roll(if_full=True))
        return ts if sizes is None else tss

    async def _bounded(self, fut: asyncio.Future[T], parts: list[Partition]) -> T:
        """``fut``'s result, or UnavailableError after the ack timeout. Then the partitions'
        leader steps down (``step_down``): its writes in flight fail and its timestamps end, so
        the node's closed timestamp — and every other partition's writes — go on; the
        partition is unavailable until an election with a majority of its replicas."""
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.ack_timeout_s)
        except asyncio.TimeoutError:
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no "never retrieved" noise
            for part in parts:
                if (part.table_id, part.pid) in part.store.shippers:
                    self.tasks.spawn(self.step_down(part.table_id, part.pid))
            raise UnavailableError(f"no majority of the partition's replicas acknowledged the write within "
                                   f"{self.ack_timeout_s:g} s; it may still be applied (upserts are safe to retry)"
                                   ) from None

    def merge_if_due(self, part: Partition) -> None:
        """Merge ``part``'s memtable runs that are due: small ones now, a bigger one in the
        background (a worker thread)."""
        if part.index.merge_due and part.index.merge_small():
            self.tasks.spawn(part.index.merge_memtable())


def served(table: Table, pids: np.ndarray) -> None:
    """Refuse rows of partitions another node serves (the node layer routes them there; this
    is the engine's own guard against writing a partition twice in a cluster)."""
    foreign = set(np.unique(pids).tolist() if len(pids) > 64 else pids.tolist()) - table.owned
    if foreign:
        raise UnavailableError(f"table {table.name!r}: partitions {sorted(foreign)} are not served by this node")


def tombstone_batch(schema: SchemaVersion, karrs: Sequence[pa.Array]) -> pa.RecordBatch:
    """Deletion rows of the keys ``karrs`` (one array per key column): the key, and fillers."""
    by_id = dict(zip(schema.pk.ids, karrs))
    n = len(karrs[0])
    cols = [by_id[c.id] if c.id in by_id else _filler(c, n) for c in schema.columns]
    return pa.RecordBatch.from_arrays(cols, schema=schema.arrow())


def _filler(col: Column, n: int) -> pa.Array:
    """Values for a tombstone's non-key columns: null, or zeros where nulls are refused."""
    t = col.type.arrow()
    if col.nullable:
        return pa.nulls(n, t)
    return pa.repeat(pa.scalar(_zero(t), t), n)


def _zero(t: pa.DataType) -> object:
    if pa.types.is_struct(t):
        return {f.name: _zero(f.type) for f in t}
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ""
    if pa.types.is_fixed_size_binary(t):
        return bytes(t.byte_width)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b""
    if pa.types.is_boolean(t):
        return False
    return 0


def _last_wins(batch: pa.RecordBatch, keys: np.ndarray,
               deleted: np.ndarray | None) -> tuple[pa.RecordBatch, np.ndarray, np.ndarray | None]:
    """Within one batch the last row of a key wins (as if applied in order)."""
    if len(keys) < 2 or _distinct(keys):
        return batch, keys, deleted
    _, first_rev = np.unique(keys[::-1], return_index=True)
    keep = np.sort(len(keys) - 1 - first_rev)
    return batch.take(pa.array(keep)), keys[keep], None if deleted is None else deleted[keep]


def _distinct(keys: np.ndarray) -> bool:
    """Whether no key repeats (a plain sort is ~30x cheaper than ``np.unique`` with indices)."""
    s = np.sort(keys)
    return not (s[1:] == s[:-1]).any()
