"""Subscriptions to a table's committed changes (docs/rfcs/0015-subscriptions.md).

A subscription is opened (checked, registered, its seam with the catch-up fixed — §4),
then fed by two producers: its catch-up, the changes in ``(from, C1]`` read from the
segments by the change feed's reader and paced by the subscriber; and its table's pump,
which takes the commit tail's batches once the closed timestamp passes them, decodes them
once for every subscriber of the table, and offers each subscriber what its filter selects,
then ``Closed(C)``. The pump never waits for a subscriber: one whose queue would pass its
byte budget is ended (``slow_subscriber``) and resumes from its last closed T (§6)."""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.db.changes import CommitTail, Committed
from rowstore.db.read.bridge import ExternalReads
from rowstore.db.read.matching import Filter, Round, decode_round, select
from rowstore.db.read.reader import Reader
from rowstore.db.tasks import BackgroundTasks
from rowstore.errors import QueryError, RowstoreError, SubscriptionEndedError, TableNotFoundError, UnavailableError
from rowstore.reads.predicates import parse_bbox, parse_where
from rowstore.schema import SchemaVersion
from rowstore.tables.key_check import check_prefix
from rowstore.tables.keys import key_arrays, partition_of_key, partitions_of
from rowstore.timeline import Timeline

log = logging.getLogger("rowstore.subscribe")
# After a round with changes the pump waits before the next: a first change after a quiet
# spell goes out at once, a stream of commits in rounds of several (each subscriber's frames,
# and a closed frame, per round rather than per commit). At least ROUND_GAP_S, and longer with
# many subscribers: a round costs each of them its frames (a socket write each, on the node's
# one event loop), so a table's rounds times its subscribers stay under ROUND_SENDS_PER_S — with
# 100 subscribers a round every 50 ms, with 10 or fewer every 5 ms (RFC 0015 §6, "Measured").
ROUND_GAP_S = 0.001
ROUND_SENDS_PER_S = 2000


def round_gap(subscribers: int) -> float:
    """The pause after a round with changes, for a table with ``subscribers``."""
    return max(ROUND_GAP_S, subscribers / ROUND_SENDS_PER_S)
DECODE_IN_THREAD = 4096  # rows of a round decoded in a worker thread beyond this
CATCH_UP_ROWS = 4096  # changes per catch-up item (each waits for room in the subscriber's buffer)
CATCH_UP_WINDOW = 65_536  # changes a catch-up reads from the segments at a time (about: by their estimates)
_ROW_OVERHEAD = 48  # bytes a queued change is counted for beyond its share of the round's columns


@dataclass(frozen=True)
class Changes:
    """Rows ``idx`` (positions in commit order) of ``round``, for one subscriber; ``nbytes``: what
    they are counted for in its buffer (its columns' share of the round, and a change's frame)."""

    round: Round
    idx: np.ndarray
    nbytes: int


def changes(r: Round, idx: np.ndarray, columns: list[str]) -> Changes:
    key = ("row_bytes", tuple(columns))
    per_row = r.memo.get(key)
    if per_row is None:
        per_row = r.memo[key] = sum(int(r.batch.column(c).nbytes) for c in columns) // max(r.rows, 1)
    return Changes(r, idx, len(idx) * (per_row + _ROW_OVERHEAD))


@dataclass(frozen=True)
class Closed:
    """Every matching change with ``commit_ts <= ts`` was handed on before this."""

    ts: int


Item = Changes | Closed


def parse_filter(schema: SchemaVersion, where: object, bbox: object, prefix: object, columns: object) -> Filter:
    """A subscription's filter, refused exactly as the query path refuses it (``prefix``: as a
    scan's, then equality terms on the leading key columns)."""
    terms = parse_where(schema, where)
    if prefix is not None:
        n = len(check_prefix(prefix, schema.pk, "prefix", text=True))  # a URL parameter: "5" is a key 5
        raw = list(prefix) if isinstance(prefix, (list, tuple)) else [prefix]
        terms += parse_where(schema, [[c.name, "=", v] for c, v in zip(schema.pk.columns[:n], raw)])
    box = parse_bbox(schema, bbox)
    if columns is None:
        return Filter(terms, box, [c.name for c in schema.columns])
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise QueryError("columns must be a list of column names")
    for c in columns:
        if schema.by_name(c) is None:
            raise QueryError(f"no column {c!r}")
    listed = list(dict.fromkeys(columns))
    return Filter(terms, box, listed + [k for k in schema.pk.names if k not in listed])


def prefix_partition(schema: SchemaVersion, prefix: object, partitions: int) -> int | None:
    """The one partition a subscription's ``prefix`` can match when it covers the partition
    key (as a scan's does, ``Scans.scan_partitions``); None: any partition may hold a match."""
    if prefix is None:
        return None
    values = check_prefix(prefix, schema.pk, "prefix", text=True)
    if len(values) < schema.pk.partition_columns:
        return None
    return partition_of_key(schema.pk, values, partitions)


class Subscription:
    """One subscriber's stream of :data:`Item` (``next``), ended by ``SubscriptionEndedError``."""

    def __init__(self, name: str, table_id: str, schema: SchemaVersion, filt: Filter, limit: int,
                 pids: frozenset[int] | None = None):
        self.name, self.table_id, self.schema, self.filter, self.limit = name, table_id, schema, filt, limit
        self.pids = pids  # only these partitions' changes (None: every partition served here)
        self.after = 0  # C1: changes at or below it come from the catch-up (RFC 0015 §4)
        self.seamed = False  # C1 is fixed: until then the pump's rounds (all at or below C1) pass it by
        self.live = False  # the catch-up is done (pump items are queued, not held)
        self.handed = 0  # the last closed timestamp handed on by next()
        self.progress_at = 0.0  # loop time of the last Closed offered
        self.ended: SubscriptionEndedError | None = None
        self.catching_up: asyncio.Task[None] | None = None
        self._items: deque[Item] = deque()
        self._held: list[Item] = []  # the pump's items while the catch-up runs
        self._bytes = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._over = asyncio.Event()

    async def finished(self) -> SubscriptionEndedError:
        """Once the subscription ended: why."""
        await self._over.wait()
        assert self.ended is not None  # set before _over
        return self.ended

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def offer(self, item: Item) -> None:
        """From the pump: queued, never waited for; past the byte budget the subscription ends."""
        if self.ended is not None:
            return
        q = self._items if self.live else self._held
        if isinstance(item, Closed):
            if q and isinstance(q[-1], Closed):
                q[-1] = item  # an unsent progress frame says less than this one
            else:
                q.append(item)
        else:
            if self._bytes and self._bytes + item.nbytes > self.limit:  # one round always fits an empty queue
                self.end("slow_subscriber", f"more than {self.limit} bytes of changes are waiting for this "
                                            f"subscriber (subscriptions.buffer_bytes); resume from its last "
                                            f"closed timestamp (from={self.handed})", drop=True)
                return
            self._bytes += item.nbytes
            q.append(item)
        self._wake.set()

    async def put(self, item: Changes) -> None:
        """From the catch-up: waits until the subscriber has room for it."""
        while self.ended is None and self._bytes and self._bytes + item.nbytes > self.limit:
            self._room.clear()
            await self._room.wait()
        if self.ended is None:
            self._bytes += item.nbytes
            self._items.append(item)
            self._wake.set()

    def go_live(self, closed: int) -> None:
        """The catch-up handed on everything at or below ``closed`` (C1)."""
        self._items.append(Closed(closed))
        self._items.extend(self._held)
        self._held.clear()
        self.live = True
        self._wake.set()

    async def next(self) -> Item:
        while not self._items:
            if self.ended is not None:
                raise self.ended
            self._wake.clear()
            await self._wake.wait()
        item = self._items.popleft()
        if isinstance(item, Closed):
            self.handed = item.ts
        else:
            self._bytes -= item.nbytes
            if self._bytes * 2 <= self.limit:
                self._room.set()
        return item

    def end(self, code: str, message: str, drop: bool = False) -> None:
        """No more items after those queued (none, with ``drop``); then ``next`` raises."""
        if self.ended is not None:
            return
        self.ended = SubscriptionEndedError(code, message)
        if drop:
            self._items.clear()
            self._bytes = 0
        self._held.clear()
        self._wake.set()
        self._room.set()
        self._over.set()


class Subscriptions:
    """Every subscription of this node's tables, and one pump per table watched."""

    def __init__(self, reader: Reader, external: ExternalReads, tail: CommitTail, timeline: Timeline,
                 tasks: BackgroundTasks, progress_s: float, buffer_bytes: int):
        self.reader, self.external, self.tail, self.timeline = reader, external, tail, timeline
        self.tasks, self.progress_s, self.buffer_bytes = tasks, progress_s, buffer_bytes
        self._subs: dict[str, set[Subscription]] = {}  # table id -> its subscriptions
        self._pumps: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return sum(len(s) for s in self._subs.values())

    async def open(self, name: str, from_ts: int | None, where: object = None, bbox: object = None,
                   prefix: object = None, columns: object = None, partitions: list[int] | None = None,
                   trusted: bool = False) -> Subscription:
        """A subscription to ``name``'s changes with ``commit_ts > from_ts`` (None: from now),
        checked first: an unknown table, a bad filter, a ``from`` before the retention horizon
        or in the future raise here, and nothing is opened. ``partitions``: only those, each
        served here (this node's share of a subscription across nodes, RFC 0015 §8), from a
        ``from_ts`` the node merging the shares chose (``trusted``: waited for, never refused
        as future)."""
        c = await self.reader.context(name, None)
        assert c.d.schema is not None  # describe() refuses a dropped table
        filt = parse_filter(c.d.schema, where, bbox, prefix, columns)
        pids = None if partitions is None else frozenset(partitions)
        pick = prefix_partition(c.d.schema, prefix, c.d.partitions)
        if pick is not None:  # no other partition's changes are decoded to be filtered out
            pids = frozenset({pick}) if pids is None else pids & {pick}
        if pids is not None and not pids <= c.table.owned:
            raise UnavailableError(f"table {name!r}: partitions {sorted(pids - c.table.owned)} are not served by "
                                   "this node")
        if from_ts is not None:
            await self.reader.snapshot(from_ts, trusted)  # before the horizon: 410; in the future: 409
        sub = Subscription(c.d.name, c.d.table_id, c.d.schema, filt, self.buffer_bytes, pids)
        self._join(sub)
        try:  # the seam (RFC 0015 §4): every batch applied before _join is at or below C1
            await self.timeline.wait_closed(self.timeline.clock.last)
            sub.after, sub.seamed = self.timeline.closed, True
        except BaseException:
            self.close(sub)
            raise
        if from_ts is None or from_ts >= sub.after:
            sub.go_live(sub.after)
        else:
            sub.catching_up = self.tasks.spawn(self._catch_up(sub, from_ts))
        return sub

    def close(self, sub: Subscription) -> None:
        """The subscriber left (or was ended): stop feeding it."""
        subs = self._subs.get(sub.table_id)
        if subs is None or sub not in subs:
            return
        sub.end("closed", "the subscription was closed", drop=True)
        if sub.catching_up is not None:
            sub.catching_up.cancel()
        subs.discard(sub)
        self.tail.unwatch(sub.table_id)
        if not subs:
            del self._subs[sub.table_id]
            pump = self._pumps.pop(sub.table_id, None)
            if pump is not None:
                pump.cancel()

    def stop(self) -> None:
        """The node stops: every subscription ends (``stopping``) and is closed."""
        for subs in list(self._subs.values()):
            for sub in list(subs):
                sub.end("stopping", "the node is stopping; resume from the last closed timestamp (on any node)")
                self.close(sub)

    def _join(self, sub: Subscription) -> None:
        """Register ``sub`` (synchronously: the tail holds the table's batches from here on),
        starting its table's pump if it is the first."""
        tid = sub.table_id
        self.tail.watch(tid)
        self._subs.setdefault(tid, set()).add(sub)
        pump = self._pumps.get(tid)
        if pump is None or pump.done():  # the first, or its pump ended with the ones before it
            self._pumps[tid] = self.tasks.spawn(self._pump(tid, sub.name, self.timeline.closed))

    async def _pump(self, tid: str, name: str, base: int) -> None:
        """Take the table's held batches at each closed timestamp C past them and hand them out;
        ``base``: the closed timestamp the previous round ended at."""
        loop = asyncio.get_running_loop()
        while self._subs.get(tid):
            await asyncio.sleep(0)  # a round that found nothing to wait for still lets the loop run
            if not self.tail.newest(tid):
                await self.tail.arrival(tid, self.progress_s)
            top = self.tail.newest(tid)
            if top:
                await self.timeline.wait_closed(top, self.progress_s)
            C = self.timeline.closed
            if C <= base:  # wait_closed timed out: a write holds the closed timestamp back
                continue
            got = self.tail.take(tid, C)
            subs = [s for s in self._subs.get(tid, ()) if s.ended is None and s.seamed]
            try:
                changed = await self._round(tid, name, subs, got, base, C) if subs else set()
            except TableNotFoundError:
                for s in subs:
                    s.end("table_dropped", f"table {name!r} was dropped")
                return
            except RowstoreError as e:  # a round that cannot be read: its subscribers resume later
                log.warning("event=subscription_round_failed table=%s error=%r", name, e)
                for s in subs:
                    s.end("unavailable", f"the changes of table {name!r} could not be read ({e}); resume")
                return
            now = loop.time()
            for s in subs:
                if C > s.after and (s in changed or now - s.progress_at >= self.progress_s):
                    s.offer(Closed(C))
                    s.progress_at = now
            base = C
            if got:  # under a stream of commits, rounds (and every subscriber's frames) come at most this often
                await asyncio.sleep(round_gap(len(subs)))

    async def _round(self, tid: str, name: str, subs: list[Subscription], got: list[Committed], base: int,
                     C: int) -> set[Subscription]:
        """One round's changes offered to ``subs``; the subscriptions that got some. Every round
        reads the table at C as a read would — so a replicated partition's leader that lost its
        lease (another may lead it now) sends no closed timestamp it cannot vouch for."""
        c = await self.reader.context(name, C, trusted=True)
        schema = c.d.schema
        assert schema is not None  # describe() refuses a dropped table
        if c.d.table_id != tid:  # dropped, and made anew under its name
            raise TableNotFoundError(f"table {name!r} was dropped")
        for s in subs:
            if s.pids is not None and not s.pids <= c.table.owned:
                s.end("moved", f"table {name!r}: partitions {sorted(s.pids - c.table.owned)} are no longer "
                               "served by this node; resume from the last closed timestamp")
            elif got and s.schema.version != schema.version:
                s.end("schema_changed", f"table {name!r} changed its schema; resume from the last closed "
                                        "timestamp for the new columns")
        subs = [s for s in subs if s.ended is None]
        if not subs or not got:
            return set()
        rows = sum(len(g.rows.starts) for g in got)
        r, pids = await asyncio.to_thread(decode_round, got, c.schemas, schema) if rows > DECODE_IN_THREAD \
            else decode_round(got, c.schemas, schema)
        chosen = await select(r, pids, [s.filter for s in subs], schema, c.table.parts, self.reader.store,
                              c.schemas, base)
        changed = set()
        for s, idx in zip(subs, chosen):
            idx = idx[r.ts[idx] > np.uint64(s.after)]  # the catch-up has what is <= after
            if s.pids is not None:
                idx = idx[np.isin(pids[idx], np.array(sorted(s.pids), pids.dtype))]
            if len(idx):
                s.offer(changes(r, idx, s.filter.columns))
                changed.add(s)
        return changed

    async def _catch_up(self, sub: Subscription, from_ts: int) -> None:
        """The changes in ``(from_ts, sub.after]`` from the segments, then live."""
        try:
            c = await self.reader.context(sub.name, sub.after, trusted=True)
            schema = c.d.schema
            assert schema is not None  # describe() refuses a dropped table
            if schema.version != sub.schema.version:
                sub.end("schema_changed", f"table {sub.name!r} changed its schema; resume for the new columns")
                return
            mine = sorted(c.table.owned if sub.pids is None else sub.pids)
            # window by window: a catch-up over a long interval holds one window's changes at a time
            async for t, a, _ in self.external.change_windows(sub.name, from_ts, sub.after, mine, CATCH_UP_WINDOW):
                if not t.num_rows:
                    continue
                r, pids = _feed_round(t, schema, len(c.table.parts))
                # a key's old version: its previous change in the window, or the one visible at its start
                [idx] = await select(r, pids, [sub.filter], schema, c.table.parts, self.reader.store, c.schemas, a)
                for at in range(0, len(idx), CATCH_UP_ROWS):
                    await sub.put(changes(r, idx[at : at + CATCH_UP_ROWS], sub.filter.columns))
            sub.go_live(sub.after)
        except TableNotFoundError:
            sub.end("table_dropped", f"table {sub.name!r} was dropped")
        except RowstoreError as e:
            sub.end("unavailable", f"the changes of table {sub.name!r} could not be read ({e}); resume")


def _feed_round(t: pa.Table, schema: SchemaVersion, nparts: int) -> tuple[Round, np.ndarray]:
    """The change feed's table (columns, then commit_ts and op, in commit order) as a round."""
    ts = t.column("commit_ts").to_numpy().astype(np.uint64)
    deleted = pc.equal(t.column("op"), "delete").to_numpy(zero_copy_only=False).astype(bool)
    data = t.drop_columns(["commit_ts", "op"]).combine_chunks()
    batch = data.to_batches()[0] if data.num_rows else pa.RecordBatch.from_pylist([], schema=schema.arrow())
    pk = schema.pk
    return Round(batch, ts, deleted), partitions_of(pk, key_arrays(pk, batch), nparts)
