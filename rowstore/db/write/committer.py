"""Writes: a batch split by key hash into its partitions, committed with one ``BATCH …
COMMIT`` append when it touches one partition, or with the two-phase commit of RFC 0003
when it touches several — queued per table and committed as one group, whose commit point
is one catalog transaction (``txn/<id>``)."""
from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

import numpy as np
import pyarrow as pa

from catalog.abc import Catalog, Check, Delete, Put
from rowstore.errors import ConflictError, UnavailableError
from rowstore.tables.keys import encode_columns, key_arrays, partitions_of
from rowstore.codec.rows import Encoded, EncodedParts
from rowstore.schema import Column, SchemaVersion
from rowstore.rowids import split_rowids
from rowstore.segments.active import ActiveSegment
from rowstore.segments.wal import DECIDED, SPANS_NODES
from rowstore.tables.conform import PartitionShare, conform, split_by_partition, stamp
from rowstore.tables.key_check import check_key_columns, check_key_lists
from rowstore.tables.definitions import TableCatalog, TableDef
from rowstore.db.changes import CommitTail
from rowstore.db.partition import Partition
from rowstore.timeline import Timeline
from rowstore.db.registry import Table, TableRegistry
from rowstore.db.tasks import BackgroundTasks
from terrafs.catalog_ops import commit
from terrafs.failpoints import failpoint

T = TypeVar("T")
TXN_PREFIX = "txn/"
COMMITTED, ABORTED = b"committed", b"aborted"
# Bigger batches are sorted, split and encoded in a worker thread. Up to this size that is
# ~1.5 ms of CPU on the event loop, which costs less than the worker's GIL hand-offs: each
# of its numpy/Arrow/numba calls releases the GIL and may wait for it again behind the loop
# (10k-row batches, 4 clients: 0.95M -> 1.22M rows/s, medians of 8 alternating runs).
THREAD_ROWS = 16_384
GROUP_ROWS = 256_000  # rows committed together by one multi-partition group at most


@dataclass(frozen=True)
class WriteResult:
    count: int
    commit_ts: int


def txn_key(txn: int) -> str:
    return f"{TXN_PREFIX}{txn:016x}"


async def decided(catalog: Catalog, txn: int) -> bool:
    """Whether prepared batch ``txn`` committed: as the catalog says; an undecided one is
    aborted there (by compare-and-set: a late coordinator cannot commit it). What recovery,
    and a new leader adopting a replicated partition's log, ask of a segment ending in a
    prepared batch."""
    key = txn_key(txn)
    for _ in range(10):
        e = await catalog.get(key)
        if e is not None:
            return e.value == COMMITTED
        res = await commit(catalog, [Check(key, 0)], [Put(key, ABORTED)])
        if res.committed:
            return False
    raise ConflictError(f"cannot decide transaction {key}")


@dataclass
class _Member:
    """A multi-partition batch waiting in its table's commit queue."""

    work: list[tuple[Partition, PartitionShare]]  # (partition, its piece of the batch)
    schema: SchemaVersion
    fut: asyncio.Future[int]
    ts: int = 0

    @property
    def rows(self) -> int:
        return sum(p.rows for _, p in self.work)


@dataclass
class _Prepared:
    """A decided group, unlocked, waiting to be applied (``_finish_group``)."""

    group: list[_Member]
    by_pid: dict[int, list[tuple[int, Partition, PartitionShare]]]  # pid -> [(member index, partition, piece)]
    pids: list[int]
    parts: list[Partition]
    segs: list[ActiveSegment]
    got: list[np.ndarray]  # per partition: the prepared rows' rowids
    txn: int
    commits: list[asyncio.Task[None]]  # COMMIT X appends in flight


class Committer:
    def __init__(self, catalog: Catalog, definitions: TableCatalog, tables: TableRegistry, timeline: Timeline,
                 tasks: BackgroundTasks, step_down: Callable[[str, int], Coroutine[Any, Any, bool]],
                 tail: CommitTail, ack_timeout_s: float = 10.0):
        """``step_down(table id, pid)``: the leader of a replicated partition whose write missed
        its ack timeout steps down (started in the background, :meth:`_bounded`). ``tail``: every
        applied batch is handed to it before its timestamp ends (subscriptions, RFC 0015)."""
        self.catalog, self.definitions, self.tables, self.tail = catalog, definitions, tables, tail
        self.timeline, self.tasks, self.step_down = timeline, tasks, step_down
        self._decided: list[str] = []  # txn keys decided committed at recovery
        self._groups: dict[str, list[_Member]] = {}  # table id -> multi-partition batches waiting to commit
        self._leading: set[str] = set()  # table ids whose group committer is running
        self._applying: dict[str, asyncio.Task[None]] = {}  # table id -> its last decided group's finish
        # A write to a replicated partition waits this long for a majority of its replicas, then
        # answers "unavailable" (the batch may still become durable and visible later).
        self.ack_timeout_s = ack_timeout_s

    # -- recovery -----------------------------------------------------------------------------

    async def decide_at_recovery(self, txn: int, keep: bool = False) -> bool:
        """A prepared batch found at the end of a segment: committed iff the catalog says so;
        an undecided one is aborted (by compare-and-set: a late coordinator cannot commit it).

        ``keep``: the decision must stay in the catalog — the segment is one copy of a
        replicated partition's log (RFC 0010 §5), and the copy that leads it next may hold the
        prepared batch without this COMMIT and decide again."""
        committed = await decided(self.catalog, txn)
        if committed and not txn & SPANS_NODES and not keep:
            self._decided.append(txn_key(txn))  # every share of it is on this node
        return committed

    async def forget_recovered(self) -> None:
        """After recovery every participant is local and has its COMMIT: drop the decisions."""
        done = sorted(set(self._decided))
        for i in range(0, len(done), 64):
            await commit(self.catalog, [], [Delete(k) for k in done[i : i + 64]])
        self._decided.clear()

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
        by_id = dict(zip(pk.ids, karrs))
        n = len(karrs[0])
        cols = [by_id[c.id] if c.id in by_id else _filler(c, n) for c in d.schema.columns]
        batch = pa.RecordBatch.from_arrays(cols, schema=d.schema.arrow())
        return batch, np.ones(n, bool), existed

    async def write(self, d: TableDef, batch: pa.RecordBatch, deleted: np.ndarray | None) -> WriteResult:
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
            tss = [await self.timeline.begin() for _ in (sizes or (0,))]
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
            part.apply(split_rowids(ids)[1], seg.segid, piece.batch, row_ts, _deleted(piece), schema, piece.keys,
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

    async def _commit_many(self, table: Table, work: list[tuple[Partition, PartitionShare]],
                           schema: SchemaVersion) -> int:
        """Queue a multi-partition batch; one committer per table takes every batch queued
        and commits them as ONE two-phase group (one prepare fsync per partition, one
        decision), each batch keeping its own commit timestamp (LevelDB's writer queue)."""
        m = _Member(work, schema, asyncio.get_running_loop().create_future())
        q = self._groups.setdefault(table.table_id, [])
        q.append(m)
        if table.table_id not in self._leading:
            self._leading.add(table.table_id)
            self.tasks.spawn(self._group_loop(table.table_id, q))
        if not any((part.table_id, part.pid) in part.store.shippers for part, _ in work):
            return await m.fut
        return await self._bounded(m.fut, [part for part, _ in work])

    async def _group_loop(self, tid: str, q: list[_Member]) -> None:
        try:
            while q:
                group = [q.pop(0)]
                rows = group[0].rows
                while q and rows + q[0].rows <= GROUP_ROWS:
                    rows += q[0].rows
                    group.append(q.pop(0))
                try:
                    prepared = await self._commit_group(group)
                except BaseException as e:  # every member learns it; the loop goes on
                    _fail(group, e)
                    if isinstance(e, asyncio.CancelledError):
                        raise
                    continue
                # Decided and unlocked: the next group prepares (its fdatasyncs run) while this
                # one is applied; groups are applied in commit order.
                t = self._applying[tid] = self.tasks.spawn(self._finish_group(prepared, self._applying.get(tid)))
                t.add_done_callback(lambda t: self._applying.pop(tid) if self._applying.get(tid) is t else None)
        finally:
            self._leading.discard(tid)

    async def _commit_group(self, group: list[_Member]) -> _Prepared:
        """Prepare every partition's share (one append each, one fdatasync each, in parallel)
        and decide, under the partitions' writer locks; return what applying needs."""
        by_pid: dict[int, list[tuple[int, Partition, PartitionShare]]] = {}
        for i, m in enumerate(group):
            for part, piece in m.work:
                by_pid.setdefault(part.pid, []).append((i, part, piece))
        pids = sorted(by_pid)
        parts = [by_pid[p][0][1] for p in pids]
        txn = DECIDED | secrets.randbits(62)  # SPANS_NODES clear: every share is here
        async with contextlib.AsyncExitStack() as locks:
            for part in parts:
                await locks.enter_async_context(part.lock)
            segs = [await part.current() for part in parts]
            for m in group:
                m.ts = await self.timeline.begin()
            for part in parts:
                part.enter()
            try:
                encs = [_concat([(pc.enc, group[i].ts) for i, _, pc in by_pid[p]]) for p in pids]
                top = group[-1].ts
                tasks = [await part.append(seg, enc, top, txn) for part, seg, enc in zip(parts, segs, encs)]
                got = await asyncio.gather(*tasks, return_exceptions=True)
                failed = next((g for g in got if isinstance(g, BaseException)), None)
                failpoint("txn.after_prepare")
                if failed is not None or not await self._decide(txn, True):
                    for seg, g in zip(segs, got):
                        if not isinstance(g, BaseException):
                            seg.abort_prepared(g)
                    raise failed or ConflictError("the batch was aborted during recovery elsewhere")
                failpoint("txn.after_decision")
                commits = [asyncio.ensure_future(seg.commit_prepared(txn, lazy=True)) for seg in segs]
                await asyncio.sleep(0)  # COMMIT X enqueued before the locks are released
            except BaseException:
                self._leave(parts, group)
                raise
        # no exception among ``got``: any failure raised above
        return _Prepared(group, by_pid, pids, parts, segs, cast("list[np.ndarray]", got), txn, commits)

    async def _finish_group(self, g: _Prepared, before: asyncio.Task[None] | None) -> None:
        """Make a decided group's entries visible (its partitions stay "in flight" until then,
        so a checkpoint waits for them), then acknowledge it once its timestamps are closed."""
        try:
            if before is not None:
                await asyncio.wait([before])  # the previous group's entries first
            try:
                for p, part, seg, ids in zip(g.pids, g.parts, g.segs, g.got):
                    seg.note_commit_ts(g.group[0].ts)
                    locs, at = split_rowids(ids)[1], 0
                    for i, _, pc in g.by_pid[p]:
                        part.apply(locs[at : at + pc.rows], seg.segid, pc.batch, g.group[i].ts, _deleted(pc),
                                   g.group[i].schema, pc.keys, pc.pos)
                        self.tail.committed(part.table_id, part.pid, pc.enc, g.group[i].ts)
                        at += pc.rows
                    self.merge_if_due(part)
            finally:
                self._leave(g.parts, g.group)
            self.tasks.spawn(self._forget_decision(g.txn, g.commits))
            await self.timeline.wait_closed(g.group[-1].ts)
        except BaseException as e:
            _fail(g.group, e)
            raise
        for m in g.group:
            m.fut.set_result(m.ts)
        for part in g.parts:
            if part.full():
                self.tasks.spawn(part.roll(if_full=True))

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

    def _leave(self, parts: list[Partition], group: list[_Member]) -> None:
        for part in parts:
            part.leave()
        for m in group:
            self.timeline.end(m.ts)

    async def _decide(self, txn: int, want: bool) -> bool:
        """The commit point: ``txn/X`` = committed (or aborted), by compare-and-set."""
        key = txn_key(txn)
        res = await commit(self.catalog, [Check(key, 0)], [Put(key, COMMITTED if want else ABORTED)])
        if res.committed:
            return want
        e = await self.catalog.get(key)
        return e is not None and e.value == COMMITTED

    async def _forget_decision(self, txn: int, commits: list[asyncio.Task[None]]) -> None:
        """Once every participant's COMMIT X is durable, nobody needs ``txn/X`` again."""
        got = await asyncio.gather(*commits, return_exceptions=True)
        if not any(isinstance(g, BaseException) for g in got):
            await commit(self.catalog, [], [Delete(txn_key(txn))])


def served(table: Table, pids: np.ndarray) -> None:
    """Refuse rows of partitions another node serves (the node layer routes them there; this
    is the engine's own guard against writing a partition twice in a cluster)."""
    foreign = set(np.unique(pids).tolist() if len(pids) > 64 else pids.tolist()) - table.owned
    if foreign:
        raise UnavailableError(f"table {table.name!r}: partitions {sorted(foreign)} are not served by this node")


def _fail(group: list[_Member], e: BaseException) -> None:
    for m in group:
        if not m.fut.done():
            m.fut.set_exception(e)


def _concat(encs: list[tuple[Encoded, int]]) -> Encoded | EncodedParts:
    """Several batches' encoded rows for one partition as one record, each stamped with its
    own commit timestamp (rows carry theirs; the record's header carries the largest)."""
    for e, ts in encs:
        stamp(e, ts)
    if len(encs) == 1:
        return encs[0][0]
    offs = np.cumsum([0] + [e.nbytes for e, _ in encs[:-1]])
    return EncodedParts([e.buf for e, _ in encs], np.concatenate([e.starts + o for (e, _), o in zip(encs, offs)]),
                        int(offs[-1]) + encs[-1][0].nbytes)


def _filler(col: Column, n: int) -> pa.Array:
    """Values for a tombstone's non-key columns: null, or zeros where nulls are refused."""
    t = col.type.arrow()
    if col.nullable:
        return pa.nulls(n, t)
    return pa.array([_zero(t)] * n, t)


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


def _deleted(piece: PartitionShare) -> np.ndarray:
    return np.zeros(piece.rows, bool) if piece.deleted is None else piece.deleted
