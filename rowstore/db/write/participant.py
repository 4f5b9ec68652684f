"""This node's share of a batch coordinated by another node (docs/rfcs/0010-replication.md §3).

RFC 0003's two-phase commit with the coordinator elsewhere. ``reserve`` takes the writer
locks of the partitions the rows hash to (in partition order) and a timestamp above
everything this node issued and above its closed timestamp, held in flight; the
coordinator takes the largest reserved timestamp as the batch's ``commit_ts``. Because
the locks were held from the reservation on, each partition's log stays in timestamp
order, and because the reservation was in flight, the closed timestamp never passed
``commit_ts``. ``prepare`` appends ``BATCH X`` at ``commit_ts`` to each partition and
waits for the fdatasync — and keeps the locks, so ``BATCH X`` stays each log's last batch
until decided (the write-ahead format is unchanged). ``commit`` appends ``COMMIT X``,
applies the rows and answers once the closed timestamp reached ``commit_ts``; ``abort``
rolls the localids back. A reserved or prepared
batch whose coordinator goes silent is resolved here after ``timeout_s`` from the catalog's
``txn/X`` (absent: aborted by compare-and-set, so a late decision fails), as recovery does.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from catalog.abc import Catalog, Check, Put
from catalog.errors import CatalogUnavailableError
from rowstore.db.read.reader import Reader
from rowstore.db.write.by_predicate import Found, Selection, prepare_found
from rowstore.db.write.committer import Committer, served
from rowstore.db.write.two_phase import ABORTED, COMMITTED, txn_key
from rowstore.db.registry import Table
from rowstore.db.tasks import BackgroundTasks
from rowstore.errors import ConflictError, UnavailableError
from rowstore.db.partition import Partition
from rowstore.rowids import split_rowids
from rowstore.schema import SchemaVersion
from rowstore.segments.active import ActiveSegment
from rowstore.segments.wal import DECIDED
from rowstore.tables.conform import PartitionShare, conform, stamp
from rowstore.tables.definitions import TableCatalog, TableDef
from rowstore.timeline import Timeline
from terrafs.catalog_ops import commit

log = logging.getLogger("rowstore.participant")
# a cross-node batch's coordinator: (node id, incarnation) of the process that sent it
Coordinator = tuple[str, str]
ENDED_KEPT = 4096  # ended transactions remembered (txn ids are random: an old one never comes back)


@dataclass
class _Prepared:
    txn: int
    ts: int
    table: Table
    schema: SchemaVersion
    pieces: list[PartitionShare]
    parts: list[Partition]
    segs: list[ActiveSegment]
    got: list[np.ndarray | BaseException]  # per partition: its prepared rows' rowids, or why it failed
    locks: contextlib.AsyncExitStack
    coordinator: Coordinator | None = None  # who to ask whether it is still there (None: this node)
    expiry: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False  # aborted while the prepare ran: the prepare rolls back at its next step
    preparing: asyncio.Future[int] | None = None  # the one prepare's outcome (a repeated prepare waits for it)
    # a delete by predicate (RFC 0016 §6): its terms and table, and per partition what it found
    selection: Selection | None = None
    definition: TableDef | None = None
    found: list[Found] = field(default_factory=list)


@dataclass(frozen=True)
class Reserved:
    """The answer to a reserve: the timestamp this node took, the rows it holds (after
    last-wins) and, for a delete, how many of the keys existed."""

    ts: int
    rows: int
    existed: int


class Participant:
    def __init__(self, catalog: Catalog, definitions: TableCatalog, committer: Committer, timeline: Timeline,
                 tasks: BackgroundTasks, reader: Reader, timeout_s: float = 10.0,
                 gone: Callable[[Coordinator], Awaitable[bool]] | None = None):
        self.catalog, self.definitions, self.committer, self.reader = catalog, definitions, committer, reader
        self.timeline, self.tasks, self.timeout_s = timeline, tasks, timeout_s
        self._held: dict[int, _Prepared] = {}
        self._committing = 0  # batches taken out of _held by a commit still applying them
        # Transactions ended here — committed, aborted, or aborted before their reservation
        # held its locks — with how. A coordinator gives up on a reserve still queued for a
        # partition's lock and aborts it; without this the reserve took the locks later anyway
        # and held the partition until its prepare timeout — one after another for every reserve
        # queued behind it (simulation seed 4747). And a reserve delivered twice after its
        # batch committed here would hold a new, empty reservation of the same txn, which the
        # coordinator's commit then "committed" — its answer a timestamp, though this node's
        # real share was still being committed and was lost with a failover (seed 212897).
        self._ended: collections.OrderedDict[int, str] = collections.OrderedDict()
        # async (coordinator) -> True when it is gone (unreachable or restarted since): then a
        # held batch is resolved at once instead of after ``timeout_s`` (the node's cluster view)
        self.gone = gone

    @property
    def held(self) -> int:
        """Batches reserved or prepared here and not resolved yet — also one whose commit is
        under way (its rows not applied yet): until then a read here does not see it."""
        return len(self._held) + self._committing

    async def reserve(self, name: str, table_id: str, schema_version: int, rows: pa.RecordBatch | pa.Table,
                      floor: int, txn: int, delete: bool = False, coordinator: Coordinator | None = None) -> Reserved:
        """First phase: validate and split this node's rows of txn ``txn``, take their
        partitions' writer locks and a timestamp at least ``floor`` (``delete``: ``rows``
        holds the keys to delete, in the key column). Nothing is written yet. Past the
        memtables' write stall it waits first, holding nothing (``Committer.room``)."""
        if self.committer.room is not None:
            await self.committer.room()
        d = await self._checked(txn, name, table_id, schema_version)
        assert d.schema is not None  # _checked() refuses a dropped table
        existed = 0
        if delete:
            batch, deleted, existed = await self.committer.tombstones(d, rows)
        else:
            batch, deleted = conform(rows, d.schema), None
        table, pieces, n = await self.committer.split(d, batch, deleted)
        parts = [table.parts[p.pid] for p in pieces]
        locks, ts = await self._lock(txn, parts, floor)
        await self._hold(_Prepared(txn, ts, table, d.schema, pieces, parts, [], [], locks, coordinator))
        return Reserved(ts, n, existed)

    async def reserve_where(self, name: str, table_id: str, schema_version: int, where: object, bbox: object,
                            prefix: object, pids: list[int] | None, floor: int, txn: int,
                            coordinator: Coordinator | None = None) -> Reserved:
        """First phase of a delete by predicate (RFC 0016 §6): the terms checked, the writer
        locks of partitions ``pids`` (None: every one served here the terms can match) and a
        timestamp taken. Which rows match is found at the prepare, under these locks."""
        if self.committer.room is not None:
            await self.committer.room()
        d = await self._checked(txn, name, table_id, schema_version)
        assert d.schema is not None  # _checked() refuses a dropped table
        sel = Selection.parse(d.schema, where, bbox, prefix)
        table = await self.committer.tables.table(d)
        if pids is None:
            pids = sel.partitions(d.schema, d.partitions, table.owned)
        served(table, np.asarray(sorted(pids), np.int64))
        parts = [table.parts[p] for p in sorted(set(pids))]
        locks, ts = await self._lock(txn, parts, floor, settle=True)
        await self._hold(_Prepared(txn, ts, table, d.schema, [], parts, [], [], locks, coordinator, selection=sel,
                                   definition=d, found=[Found() for _ in parts]))
        return Reserved(ts, 0, 0)

    async def _checked(self, txn: int, name: str, table_id: str, schema_version: int) -> TableDef:
        """A reservation's checks: a new decided txn id not aborted already, and the table the
        coordinator saw (same id, same schema version)."""
        if not txn & DECIDED or txn in self._held:
            raise ConflictError(f"transaction {txn_key(txn)} is not a new decided transaction id")
        self._unless_aborted_early(txn)
        d = await self.definitions.describe(name)
        assert d.schema is not None  # describe() refuses a dropped table
        if d.table_id != table_id or d.schema.version != schema_version:
            raise ConflictError(f"table {name!r} changed while the batch was on its way; retry")
        return d

    async def _lock(self, txn: int, parts: list[Partition], floor: int,
                    settle: bool = False) -> tuple[contextlib.AsyncExitStack, int]:
        """The partitions' writer locks, in partition order, and a timestamp at least ``floor``;
        ``settle``: and every batch appended before applied (what a delete by predicate reads)."""
        locks = contextlib.AsyncExitStack()
        try:
            for part in parts:
                await locks.enter_async_context(part.lock)
                if settle:
                    await part.settled()
            self._unless_aborted_early(txn)  # aborted while it waited for the locks
            ts = self.timeline.begin_above(floor)
        except BaseException:
            await locks.aclose()
            raise
        for part in parts:
            part.enter()
        return locks, ts

    async def _hold(self, p: _Prepared) -> None:
        self._held[p.txn] = p
        p.expiry = self.tasks.spawn(self._expire(p.txn))
        try:
            await self.timeline.clock.observe_durably(p.ts)
        except BaseException:
            await self.abort(p.txn)
            raise

    async def prepare(self, txn: int, ts: int) -> int:
        """Second phase: ``BATCH X`` at the batch's timestamp ``ts`` (the largest any
        participant reserved) in every partition — for a delete by predicate, ``PIECE X``
        records of the rows it finds — durable on return; the locks stay held. Returns the
        rows prepared here."""
        p = self._held.get(txn)
        if p is None:
            raise UnavailableError(f"transaction {txn_key(txn)} is not reserved here (it timed out); retry")
        if p.preparing is not None:  # sent twice (a retry, a duplicate): BATCH X is appended once
            if ts != p.ts:
                raise ConflictError(f"transaction {txn_key(txn)} is prepared at {p.ts}, not {ts}")
            return await asyncio.shield(p.preparing)
        # A task of its own: a caller that goes away (cancelled) must not stop it half-way —
        # BATCH X enqueued and its rows unaccounted for, so that no abort could roll it back
        # (simulation seed 26 with the node's own coordinator: index entries past a segment's end).
        p.preparing = asyncio.ensure_future(self._prepare_held(p, txn, ts))
        p.preparing.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no noise
        return await asyncio.shield(p.preparing)

    async def _prepare_held(self, p: _Prepared, txn: int, ts: int) -> int:
        n = await self._prepare(p, txn, ts)
        # prepared, the batch may commit and show on other nodes before this share is decided:
        # no read of the present here goes below it meanwhile (rowstore/timeline.py, ``floor``)
        self.timeline.hold(ts)
        return n

    async def _prepare(self, p: _Prepared, txn: int, ts: int) -> int:
        try:
            if ts != p.ts:
                self.timeline.move(p.ts, ts)
                p.ts = ts
                await self.timeline.clock.observe_durably(ts)  # the catalog: may stall, fail, time out
            p.segs = [await part.current() for part in p.parts]
        except BaseException:
            # nothing appended yet. An abort that came meanwhile left the roll-back to this
            # prepare (and forgot the batch): done here, or its timestamp stays in flight for
            # ever — no commit on this node acknowledged again (simulation seed 41116, catalog
            # stalls). Not aborted: the batch stays held, and its abort or expiry rolls it back.
            if p.aborted:
                await self._roll_back(p)
            raise
        await self._unless_aborted(p)  # before BATCH X: an abort meanwhile released nothing yet
        if p.selection is not None:
            return await self._prepare_found(p)
        for pc in p.pieces:
            stamp(pc.enc, ts)
        tasks = [await part.append(seg, pc.enc, ts, txn) for part, seg, pc in zip(p.parts, p.segs, p.pieces)]
        p.got = await asyncio.gather(*tasks, return_exceptions=True)
        await self._unless_aborted(p)  # aborted while the appends were in flight: their localids go back now
        failed = next((g for g in p.got if isinstance(g, BaseException)), None)
        if failed is not None:
            self._forget(p)
            await self._roll_back(p)
            raise failed
        return sum(pc.rows for pc in p.pieces)

    async def _prepare_found(self, p: _Prepared) -> int:
        """A delete by predicate's pieces, found and appended partition by partition; a failure
        or an abort meanwhile rolls back every piece appended (the rowids of each partition's
        first piece are all ``_roll_back`` needs)."""
        assert p.selection is not None and p.definition is not None  # a delete by predicate's
        p.got = [np.zeros(0, np.uint64) for _ in p.parts]
        try:
            n = await prepare_found(self.reader, self.committer.tail, p.definition, p.table, p.selection, p.parts,
                                    p.segs, p.found, p.ts, p.txn, p.got, lambda: p.aborted)
        except BaseException:
            self._forget(p)
            await self._roll_back(p)
            raise
        await self._unless_aborted(p)
        return n

    async def _unless_aborted(self, p: _Prepared) -> None:
        """Raise if ``p`` was aborted while its prepare ran, after rolling back what it appended."""
        if p.aborted:
            await self._roll_back(p)
            raise UnavailableError(f"transaction {txn_key(p.txn)} was aborted here while it was being prepared "
                                   "(its coordinator timed out); retry")

    async def commit(self, txn: int) -> int:
        """Second phase, decided committed: ``COMMIT X``, apply, answer once closed. A txn no
        longer held was resolved already: committed is fine, aborted is a conflict."""
        p = self._held.pop(txn, None)
        if p is not None and p.preparing is None:  # a reservation never prepared: none a coordinator
            self._forget(p)  # decided on (a reserve delivered twice?): its commit commits nothing
            await self._roll_back(p)
            raise UnavailableError(f"transaction {txn_key(txn)} was reserved here but never prepared; retry")
        if p is None:
            e = await self.catalog.get(txn_key(txn))
            if e is not None and e.value == COMMITTED:
                return 0
            raise UnavailableError(f"transaction {txn_key(txn)} was aborted here (its coordinator was too slow); "
                                   "retry")
        self._forget(p, "committed")
        self._committing += 1
        try:
            commits = [asyncio.ensure_future(seg.commit_prepared(txn)) for seg, ids in zip(p.segs, p.got)
                       if not isinstance(ids, BaseException) and len(ids)]  # a partition it found nothing in: none
            await asyncio.sleep(0)  # COMMIT X enqueued before the locks are released
            await p.locks.aclose()
            try:
                for part, f in zip(p.parts, p.found):  # a delete by predicate's deletions
                    for i, keys in enumerate(f.keys):
                        part.apply_deletions(keys, p.ts)
                        if f.encs:
                            self.committer.tail.committed(part.table_id, part.pid, f.encs[i], p.ts)
                    self.committer.merge_if_due(part)
                for part, seg, pc, ids in zip(p.parts, p.segs, p.pieces, p.got):
                    assert not isinstance(ids, BaseException)  # a failed prepare is forgotten: never committed
                    part.apply(split_rowids(ids)[1], seg.segid, pc.batch, p.ts,
                               np.zeros(pc.rows, bool) if pc.deleted is None else pc.deleted, p.schema, pc.keys,
                               pc.pos)
                    self.committer.tail.committed(part.table_id, part.pid, pc.enc, p.ts)
                    self.committer.merge_if_due(part)
            finally:
                for part in p.parts:
                    part.leave()
                self.timeline.end(p.ts)
        finally:
            self._committing -= 1
        await asyncio.gather(*commits)
        await self.timeline.wait_closed(p.ts)
        for part in p.parts:
            if part.full():
                self.tasks.spawn(part.roll(if_full=True))
        return p.ts

    async def abort(self, txn: int) -> None:
        """Second phase, aborted (or never decided): the prepared rows are forgotten. While a
        prepare runs — waiting for its segment or the clock, or with its appends in flight, whose
        localids are not known yet — the prepare itself rolls back at its next step (and keeps
        the locks until then, so nothing is appended after BATCH X meanwhile, and BATCH X is
        never appended once the locks are gone)."""
        p = self._held.get(txn)
        if p is None:
            if txn not in self._ended:  # its reserve may still be on its way, or waiting for the locks
                self._end(txn, "aborted by its coordinator before its reservation held the locks")
            return
        self._forget(p)
        if p.preparing is not None and not p.preparing.done():
            p.aborted = True
            return
        await self._roll_back(p)

    def _unless_aborted_early(self, txn: int) -> None:
        """Refuse a reservation of a transaction that ended here already: aborted before its
        reserve came, or committed or aborted since an earlier reserve of it (sent twice)."""
        how = self._ended.get(txn)
        if how is not None:
            raise UnavailableError(f"transaction {txn_key(txn)} was {how} here already; retry")

    def _end(self, txn: int, how: str) -> None:
        self._ended[txn] = how
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _forget(self, p: _Prepared, how: str = "aborted") -> None:
        """``p`` no longer held: it ended (``how``), and its expiry is not needed."""
        self._end(p.txn, how)
        self._held.pop(p.txn, None)
        if p.expiry is not None and p.expiry is not asyncio.current_task():
            p.expiry.cancel()

    async def _roll_back(self, p: _Prepared) -> None:
        for seg, g in zip(p.segs, p.got):
            if not isinstance(g, BaseException) and len(g):
                seg.abort_prepared(g)
        for part in p.parts:
            part.leave()
        self.timeline.end(p.ts)
        await p.locks.aclose()

    async def _expire(self, txn: int) -> None:
        """The coordinator went silent or away: decide from the catalog, as recovery would."""
        t0 = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(min(0.5, self.timeout_s))
            p = self._held.get(txn)
            if p is None:
                return
            if p.preparing is not None and not p.preparing.done():  # a delete by predicate finding its rows:
                t0 = asyncio.get_running_loop().time()  # its coordinator waits for it; time counts from its end
                continue
            if asyncio.get_running_loop().time() - t0 >= self.timeout_s:
                break
            if p.coordinator is not None and self.gone is not None:
                try:
                    if await self.gone(p.coordinator):
                        break
                except Exception as err:  # noqa: BLE001 - cannot tell: wait for the timeout
                    log.warning("event=coordinator_check_failed txn=%s error=%r", txn_key(txn), err)
        key = txn_key(txn)
        delay = 0.05
        while True:  # until the catalog answers: a share left held, undecided, holds its locks for ever
            try:
                res = await commit(self.catalog, [Check(key, 0)], [Put(key, ABORTED)])
                e = None if res.committed else await self.catalog.get(key)
                break
            except CatalogUnavailableError as err:  # a timeout too: the write may have landed (a
                log.warning("event=decision_unknown txn=%s error=%r", key, err)  # retry's
                await asyncio.sleep(delay)  # compare-and-set then fails, and the decision is read)
                delay = min(delay * 2, 1.0)
        if e is not None and e.value == COMMITTED:
            log.warning("event=prepared_resolved txn=%s outcome=committed", key)
            await self.commit(txn)
        else:
            log.warning("event=prepared_resolved txn=%s outcome=aborted", key)
            await self.abort(txn)
