"""The two-phase commit of batches that touch several partitions (RFC 0003), mixed into
:class:`rowstore.db.write.committer.Committer`: such batches queue per table and commit as one
group — one prepare append and fdatasync per partition, one decision, ``txn/<id>`` in the
catalog, the commit point — then are applied in commit order; and the decisions recovery
takes for a segment ending in a prepared batch."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np

from catalog.abc import Catalog, Check, Delete, Put
from catalog.errors import CatalogUnavailableError
from rowstore.codec.rows import Encoded, EncodedParts
from rowstore.db.changes import CommitTail
from rowstore.db.partition import Partition
from rowstore.db.registry import Table
from rowstore.db.tasks import BackgroundTasks
from rowstore.errors import ConflictError
from rowstore.rowids import split_rowids
from rowstore.schema import SchemaVersion
from rowstore.segments.active import ActiveSegment
from rowstore.segments.wal import DECIDED, SPANS_NODES
from rowstore.tables.conform import PartitionShare, stamp
from rowstore.timeline import Timeline
from terrafs.catalog_ops import commit
from terrafs.failpoints import failpoint
from terrafs.entropy import Entropy

log = logging.getLogger("rowstore.db.two_phase")

T = TypeVar("T")
TXN_PREFIX = "txn/"
COMMITTED, ABORTED = b"committed", b"aborted"
GROUP_ROWS = 256_000  # rows committed together by one multi-partition group at most


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


class TwoPhaseCommit:
    """Multi-partition batches committed in groups, and recovery's decisions (state: the
    committer's ``catalog``, ``timeline``, ``tasks``, ``tail``, ``_decided``, ``_groups``,
    ``_leading``, ``_applying``)."""

    # the committer's state read and set here (rowstore.db.write.committer.Committer)
    catalog: Catalog
    timeline: Timeline
    tasks: BackgroundTasks
    tail: CommitTail
    entropy: Entropy  # transaction ids
    _decided: list[str]  # txn keys decided committed at recovery
    _groups: dict[str, list[_Member]]  # table id -> multi-partition batches waiting to commit
    _leading: set[str]  # table ids whose group committer is running
    _applying: dict[str, asyncio.Task[None]]  # table id -> its last decided group's finish

    if TYPE_CHECKING:  # the committer's methods used here
        async def _bounded(self, fut: asyncio.Future[T], parts: list[Partition]) -> T: ...

        def merge_if_due(self, part: Partition) -> None: ...

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

    # -- groups -------------------------------------------------------------------------------

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
        txn = DECIDED | self.entropy.bits(62)  # SPANS_NODES clear: every share is here
        async with contextlib.AsyncExitStack() as locks:
            for part in parts:
                await locks.enter_async_context(part.lock)
            segs = [await part.current() for part in parts]
            for m, ts in zip(group, await self.timeline.begin_many(len(group))):
                m.ts = ts
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
                        part.apply(locs[at : at + pc.rows], seg.segid, pc.batch, g.group[i].ts, deleted_of(pc),
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

    def _leave(self, parts: list[Partition], group: list[_Member]) -> None:
        for part in parts:
            part.leave()
        for m in group:
            self.timeline.end(m.ts)

    async def _decide(self, txn: int, want: bool) -> bool:
        """The commit point: ``txn/X`` = committed (or aborted), by compare-and-set. Until the
        catalog answers, this waits, and the shares stay prepared, each its segment's last
        batch: the partitions' locks are held. An outcome this node cannot learn may still be
        "committed", and a share that is then neither committed nor rolled back loses its place
        in the log. Recovery decides only a trailing prepared batch, and a later batch took the
        localids that a reader of the file gives to the committed batches (index entries past
        a segment's end, and acknowledged rows lost: the simulation with per-node catalog
        faults, RFC 0010). Retrying is safe: the first attempt's write, if it landed, makes the
        compare-and-set fail, and the decision is then read."""
        key = txn_key(txn)
        delay = 0.05
        while True:
            try:
                res = await commit(self.catalog, [Check(key, 0)], [Put(key, COMMITTED if want else ABORTED)])
                if res.committed:
                    return want
                e = await self.catalog.get(key)
                return e is not None and e.value == COMMITTED
            except CatalogUnavailableError as err:  # a timeout too: its outcome unknown
                log.warning("event=decision_unknown txn=%s error=%r", key, err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _forget_decision(self, txn: int, commits: list[asyncio.Task[None]]) -> None:
        """Once every participant's COMMIT X is durable, nobody needs ``txn/X`` again."""
        got = await asyncio.gather(*commits, return_exceptions=True)
        if not any(isinstance(g, BaseException) for g in got):
            await commit(self.catalog, [], [Delete(txn_key(txn))])


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


def deleted_of(piece: PartitionShare) -> np.ndarray:
    """Per row of ``piece``: whether it is a deletion."""
    return np.zeros(piece.rows, bool) if piece.deleted is None else piece.deleted
