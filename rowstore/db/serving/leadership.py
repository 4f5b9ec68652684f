"""Leading and following replicated partitions (docs/rfcs/0010-replication.md §5).

A partition with R > 1 replicas is served by this node only between :meth:`promote` and
:meth:`demote`: promotion takes over the copies the follower side holds (or this node's own
segments), recovers them as active segments, starts shipping to the followers and replays the
partition's index from its checkpoint mark; demotion stops all of it. Reads of a led
partition need the leader's lease (:meth:`check_lease`)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, cast

from rowstore.errors import FencedError, UnavailableError
from rowstore.db.read.leaderless import read_watermark
from rowstore.replication.follower import ReplicaStore, SegmentPiece
from rowstore.replication.leader import Shipper, Transport
from rowstore.segments.position import NOTHING, Position, rep_key
from rowstore.segments.records import SegState
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableDef
from rowstore.index.key_manifest import Claim
from rowstore.db.partition import Partition
from rowstore.db.registry import TableRegistry
from terrafs.errors import MirrorError
from terrafs.failpoints import mutated

log = logging.getLogger("rowstore.db.leadership")


def last_byte(sh: Shipper) -> Position:
    """The position after the last byte of the log ``sh`` leads: an empty segment begun last (a
    roll) holds nothing, and no piece of it is ever sent — a follower holding the segment before
    it holds the whole log."""
    return next((Position(q, sh.segs[q].file.durable_size) for q in sorted(sh.segs, reverse=True)
                 if sh.segs[q].file.durable_size > 0), NOTHING)


class Leadership:
    def __init__(self, store: SegmentStore, replicas: ReplicaStore, tables: TableRegistry,
                 decide: Callable[[int], Awaitable[bool]], *,
                 observe: Callable[[int], None], observe_durably: Callable[[int], Awaitable[None]],
                 present: Callable[[], int], hold_present: Callable[[int], None],
                 monotonic: Callable[[], float] = time.monotonic,
                 spawn: Callable[[Coroutine[Any, Any, None]], object] = asyncio.ensure_future):
        """The clock's hooks keep invariant C of RFC 0010 and have no default: ``observe(ts)``, a
        new leader commits above the log it took; ``observe_durably(ts)``, the election's floor,
        persisted before this node leads, so that after a restart its present — which it answers
        to fences — is above every read it served at that floor (it may be the only one of the
        next election's majority that knows of them: simulation seed 9919); ``present()``, the
        clock's present, sent to followers and answered to fences; ``hold_present(floor)``, no
        read of the present here goes below the election's floor (``Timeline.hold``: a batch in
        flight here may hold ``closed`` below it)."""
        self.store, self.replicas, self.tables, self.decide = store, replicas, tables, decide
        self.monotonic = monotonic  # leases (a simulation runs it on virtual time)
        self.spawn = spawn  # background work: a promotion served once its log is on a majority
        self.observe, self.observe_durably, self.present = observe, observe_durably, present
        self.hold_present = hold_present
        self.fenced_at: dict[tuple[str, int], float] = {}  # monotonic time a fence made this node step down
        self.fenced_epoch: dict[tuple[str, int], int] = {}  # the highest epoch this node was fenced with
        # One hand-over at a time per partition: promotion, demotion, fences and the follower
        # side's appends and clean-up all take it, so a message for the partition never finds
        # its copies half handed over (an append reloading the record while promotion held
        # the files acted on them — it discarded them once).
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    def _lock(self, table_id: str, pid: int) -> asyncio.Lock:
        return self._locks.setdefault((table_id, pid), asyncio.Lock())

    def shipper(self, table_id: str, pid: int) -> Shipper | None:
        return self._shipper((table_id, pid))

    def led(self) -> dict[tuple[str, int], Shipper]:
        return dict(self._shippers())

    def _shippers(self) -> dict[tuple[str, int], Shipper]:
        """The store's shippers: every one is a :class:`Shipper`, put there by :meth:`_promote`
        (the segments layer cannot name the class: replication sits above it)."""
        return cast("dict[tuple[str, int], Shipper]", self.store.shippers)

    def _shipper(self, key: tuple[str, int]) -> Shipper | None:
        return self._shippers().get(key)

    async def promote(self, d: TableDef, pid: int, epoch: int, base: int, start: Position, followers: list[str],
                      transport: Transport, lease_s: float, on_fenced: Callable[[Shipper], None]) -> Shipper:
        """Lead partition ``pid`` of ``d`` at ``epoch`` (the placement already says so).
        FencedError when this node promised a newer epoch meanwhile (the placement it read
        is stale: another election followed)."""
        async with self._lock(d.table_id, pid):
            return await self._promote(d, pid, epoch, base, start, followers, transport, lease_s, on_fenced)

    async def _promote(self, d: TableDef, pid: int, epoch: int, base: int, start: Position, followers: list[str],
                       transport: Transport, lease_s: float, on_fenced: Callable[[Shipper], None]) -> Shipper:
        key = (d.table_id, pid)
        old = self._shipper(key)
        if old is not None:
            if old.epoch >= epoch:
                return old
            await self._demote(d.table_id, pid)
        await self.tables.table(d)  # opened without this partition (not led yet)
        rec, version, files = await self.replicas.take(d.table_id, pid)
        if rec.promised > epoch:
            self.replicas.forget(d.table_id, pid)
            self._promised_before(key, rec.promised)
            raise FencedError(f"partition {pid}: epoch {epoch} is older than the promised {rec.promised}",
                              rec.promised)
        try:
            segs = await self.store.adopt(d.table_id, pid, epoch, rec.segs, files,
                                          rep_key(d.table_id, pid, self.store.node) if version else None, version,
                                          self.decide)
        except BaseException:
            self.replicas.forget(d.table_id, pid)  # reload the record on the next message
            raise
        # above every commit of the log, the partition's watermark and every read T the previous
        # leaders could serve (the election's clock floor)
        wm = await read_watermark(self.store.catalog, d.table_id, pid)
        floor = next((e.floor for e in await self.replicas.history(d.table_id, pid) if e.epoch == epoch), 0)
        if mutated("commit_below_read"):  # a test's deliberate bug (terrafs/failpoints.py): C broken
            floor = 0
        await self.observe_durably(max([s.max_ts or 0 for s in segs] + [wm.ts if wm else 0, floor]))
        self.hold_present(floor)
        sh = Shipper(d.table_id, pid, epoch, base, start, followers, transport, lease_s, on_fenced=on_fenced,
                     clock=self.present, monotonic=self.monotonic, catalog=self.store.catalog)
        for seg in segs:
            sh.register(seg.seq, seg)
        self.store.shippers[key] = sh
        sh.start_links()
        # It serves nothing (reads, writes, index checkpoints, seals) before a majority holds
        # the log it adopted (RFC 0010, "settle"): at once when the followers already do, else
        # from the background once they caught up (this call, and the partition's lock, do not
        # wait for a copy that may take long; fences and appends of a newer epoch step it down).
        end = last_byte(sh)
        if end != NOTHING and not await self._held(sh, end, sh.lease_s):
            log.info("event=partition_settling table=%s partition=%d epoch=%d end=%s", d.name, pid, epoch, list(end))
            self.spawn(self._serve_once_held(d, sh, end))
            return sh
        await self._serve(d, sh)
        return sh

    async def _serve(self, d: TableDef, sh: Shipper) -> None:
        """Open the partition led by ``sh`` (its index replayed from the manifest's mark) and serve it."""
        table = await self.tables.table(d)
        try:
            latest = await self.tables.latest_def(d)
            assert latest.schema is not None  # the newest definition with a schema
            part = Partition(self.store, d.table_id, sh.pid, table.kind, table.indexed)
            n = await part.open(await self.tables.schemas_of(latest), latest.schema,
                                Claim(self.store.node, sh.epoch))
            self.observe(part.newest_ts)
        except BaseException:
            await self._demote(d.table_id, sh.pid)  # half a promotion serves nothing; the next reconcile retries
            raise
        table.serve(part, sh.epoch)
        log.info("event=partition_promoted table=%s partition=%d epoch=%d base=%d start=%s replayed=%d "
                 "followers=%s", d.name, sh.pid, sh.epoch, sh.base, list(sh.start), n, ",".join(sh.followers))

    async def _held(self, sh: Shipper, end: Position, within: float) -> bool:
        """Whether a majority holds the log up to ``end`` within ``within`` seconds; a shipper
        fenced meanwhile steps down (UnavailableError)."""
        try:
            async with asyncio.timeout(within):
                await sh.wait_for(end)
            return True
        except TimeoutError:
            return False
        except MirrorError:
            await self._demote(sh.table_id, sh.pid)
            raise UnavailableError(f"partition {sh.pid}: fenced before its epoch {sh.epoch} began") from None

    async def _serve_once_held(self, d: TableDef, sh: Shipper, end: Position) -> None:
        """Serve the partition once a majority holds its log up to ``end``; nothing if ``sh``
        stopped leading first (fenced, demoted: its wait fails with MirrorError)."""
        try:
            await sh.wait_for(end)
        except MirrorError:
            return
        async with self._lock(d.table_id, sh.pid):
            if self._shipper((d.table_id, sh.pid)) is sh and sh.fenced is None and not sh.closed:
                await self._serve(d, sh)

    async def demote(self, table_id: str, pid: int) -> bool:
        """Stop leading ``pid``: writes in flight fail, its files close (they are this node's
        copies from now on, recorded in its replica row by the next leader's promotion)."""
        async with self._lock(table_id, pid):
            return await self._demote(table_id, pid)

    async def _demote(self, table_id: str, pid: int) -> bool:
        sh = self._shippers().pop((table_id, pid), None)
        if sh is None:
            return False
        table = self.tables.get(table_id)
        if table is not None and pid in table.owned:
            old = table.unserve(pid)
            old.retired = True  # no new segment; and nothing more published for it (stale)
            old.index.moved = True
        await sh.close()
        self.store.not_led.add((table_id, pid))  # first: a read in flight meets its files gone as 503
        for inode in self.store.release_local(table_id, pid):
            await self.store.fs.close_active(inode)
        self.store.epochs.pop((table_id, pid), None)
        self.replicas.forget(table_id, pid)
        log.warning("event=partition_demoted table=%s partition=%d epoch=%d", table_id, pid, sh.epoch)
        return True

    def _promised_before(self, key: tuple[str, int], promised: int) -> None:
        """A promise found in the replica row that this process did not make (before a restart,
        to an election that did not finish): counted as a fence, so the reconcile's next take
        runs an election (``node/cluster/leading.py``) instead of promoting at the placed epoch
        again — refused for ever (simulation seed 22, once the simulation ran the reconcile's
        rules)."""
        self.fenced_epoch[key] = max(self.fenced_epoch.get(key, 0), promised)

    async def fence(self, table_id: str, pid: int, epoch: int, force: bool = False) -> dict[str, Any]:
        """Promise ``epoch`` for a partition: a follower's copies answer through the replica
        store; a node holding its own segments of the partition (it led it, and was not
        replaced yet) answers for them — after stepping down if it still leads, and with the
        promise recorded in its replica row all the same (it must not lead an older epoch
        after answering for a newer one: its answer may be part of that election's majority)."""
        async with self._lock(table_id, pid):
            led = (table_id, pid) in self.store.shippers
            await self._yield_to(table_id, pid, epoch)
            self.fenced_at[(table_id, pid)] = self.monotonic()  # an election is under way elsewhere
            self.fenced_epoch[(table_id, pid)] = max(self.fenced_epoch.get((table_id, pid), 0), epoch)
            own = await self.store.own_log(table_id, pid)
            if own is None:
                # A leader with its whole log offloaded holds no segments of its own: it answers
                # as a follower, from a record its step-down made it reload — which counts as
                # just reached by a leader. It was that leader, and it stopped: nothing to wait
                # for (without this every hand-over of such a partition failed, and left it unled).
                # Its clock goes in the answer, not only the last one a leader sent it: it may
                # be a leader that restarted, with reads served up to its present that no other
                # member of this election heard of (C, RFC 0010 §5 "Clocks").
                out = await self.replicas.fence(table_id, pid, epoch, force or led)
                return {**out, "clock": max(int(out.get("clock") or 0), self.present())}
            try:
                await self.replicas.fence(table_id, pid, epoch, force=True)  # the promise; no copies in it
            except FencedError as e:
                if e.promised != epoch:  # promised this very epoch already: a failed election's retry
                    raise
            last, pos = own
            return {"last": last, "pos": list(pos), "clock": self.present()}  # it serves nothing after this

    async def append(self, table_id: str, pid: int, epoch: int, base: int, start: Position, pieces: list[SegmentPiece],
                     leader: str = "", clock: int = 0) -> dict[str, Any]:
        """A leader's append to this node's copy. While this node leads the partition, an
        older or equal epoch is fenced, and a newer one (its election is over: the epoch comes
        from the placement's compare-and-set) makes this node step down first."""
        async with self._lock(table_id, pid):
            await self._yield_to(table_id, pid, epoch)
            out = await self.replicas.append(table_id, pid, epoch, base, start, pieces, leader, clock)
        # Taken durably before it is acknowledged: the leader may serve reads up to this clock
        # plus the lease once a majority acknowledged it, and this replica answers its present
        # to the next election's fence — also after a restart, when the clock it took in memory
        # (``ReplicaStore.leader_clocks``) is gone and its wall clock may lag the leader's by
        # more than the lease. The clock's persisted mark runs 1 s ahead, so this writes to the
        # catalog about once a second, not once a round (C, RFC 0010 §5 "Clocks").
        await self.observe_durably(clock)
        return out

    async def _yield_to(self, table_id: str, pid: int, epoch: int) -> None:
        """A message of ``epoch`` for a partition led here: fenced unless newer; then step down."""
        sh = self._shipper((table_id, pid))
        if sh is not None:
            if epoch <= sh.epoch:
                raise FencedError(f"epoch {epoch} is not above the leading epoch {sh.epoch}", sh.epoch)
            await self._demote(table_id, pid)

    async def prune(self, table_id: str, pid: int, follows: bool) -> int:
        """The follower side's clean-up of copies the leader offloaded or deleted (all of them
        when this node no longer ``follows`` the partition). The segment rows are listed under
        the partition's lock: a copy the leader started after a listing made outside it (its
        row is written before its first append is shipped) would look deleted, and an
        acknowledged append would be dropped from this replica."""
        async with self._lock(table_id, pid):
            if (table_id, pid) in self.store.shippers:
                return 0
            keep = {r.segid for r in await self.store.list(table=table_id) if r.partition == pid
                    and r.state in (SegState.ACTIVE, SegState.SEALED)} if follows else set()
            return await self.replicas.prune(table_id, pid, keep)

    def check_lease(self, table_id: str, pids: Iterable[int], T: int | None = None) -> Awaitable[None] | None:
        """Refuse to read a replicated partition led here without a current lease. A read at T
        beyond what a majority of the partition's replicas took of this leader's clock
        (``Shipper.reach``: its clock jumped ahead since its last rounds, or observed a T from a
        node ahead of it) must first await what this returns: a round that carries it there,
        or else UnavailableError. Otherwise the next leader's floor could lie below T, and it
        could commit below a read served here (C, RFC 0010 §5 "Clocks"; simulation seed 17 with
        ``--clock-jump 0.5``). None: nothing to await."""
        short = []
        for pid in pids:
            sh = self._shipper((table_id, pid))
            if sh is None or mutated("lease_outlives_term"):  # the mutation: no lease is checked at all
                continue
            if not sh.lease_ok():
                raise UnavailableError(f"partition {pid} has no majority of its replicas within the lease; retry")
            if T is not None and T > sh.reach():
                short.append(sh)
        return _covered(short, T) if short and T is not None else None

    def status(self) -> dict[str, Any]:
        return {f"{t}/{p}": sh.status() for (t, p), sh in self._shippers().items()}


async def _covered(shippers: list[Shipper], T: int) -> None:
    for sh in shippers:
        if not await sh.cover(T, sh.lease_s):
            raise UnavailableError(f"partition {sh.pid}: no majority of its replicas took this leader's clock up to "
                                   f"the read's T {T} within the lease; retry")


__all__ = ["Leadership", "NOTHING"]
