"""The leader's side: ship each write group of a partition's active segments to its followers
and hold the group until a majority has it durable (docs/format/replication.md).

One :class:`Shipper` per partition this node leads, one :class:`_Link` per follower. A link
sends the follower what it lacks in log order: bytes from the leader's files (catch-up) and
then the group in flight, whose bytes the shipper keeps until the next group of that segment
begins. Each answer carries the follower's durable position; a group is released once
enough followers reached its end. Idle links send heartbeats, which keep the leader's read
lease (a majority answered within ``lease_s``) fresh.
"""
from __future__ import annotations

import abc
import asyncio
import logging
import time
from functools import partial
from collections.abc import Callable, Iterable
from typing import Any, cast

from catalog.abc import Catalog, Check
from rowstore.errors import FencedError
from rowstore.replication.epochs import History, epochs_key
from rowstore.hlc import MAX_TS, ts_from_ms
from rowstore.segments.active import ActiveSegment
from rowstore.segments.position import NOTHING, Position
from rowstore.segments.wal import REC
from terrafs.active import ActiveFile
from terrafs.errors import ClosedError, MirrorError

log = logging.getLogger("rowstore.replication.leader")
CHUNK = 4 << 20  # catch-up bytes per message at most
LEASE_DRIFT = 1.1  # how much faster one node's monotonic clock may run than another's


def lease_wait(answers: Iterable[dict[str, Any]], lease_s: float) -> float:
    """How long a forced election waits, after its promises, before it names a leader: the old
    leader was not fenced and its followers promised while it still reached them, so its read
    lease may run until ``lease_s`` after the latest append one of them took (it needs one of
    them for a majority; none acknowledges it any more). Clocks may run 10% apart."""
    ages = [a.get("contact_age_s") for a in answers]
    if any(a is None for a in ages):  # an old node's answer: assume it just heard
        return lease_s * LEASE_DRIFT
    ages_s = cast("list[float]", ages)  # none of them None: checked above
    return max(lease_s * LEASE_DRIFT - min(ages_s, default=lease_s * LEASE_DRIFT), 0.0)


def clock_floor(answers: Iterable[dict[str, Any]], lease_s: float) -> int:
    """The lowest timestamp a new leader may hand out (RFC 0010 §5, "Clocks"): above every
    read T the old leader could still serve — its clock when it sent a round some promising
    replica took (``clock`` in the answer), plus the lease that round gave it. 0: unknown."""
    top = max((int(a.get("clock") or 0) for a in answers), default=0)
    return top + ts_from_ms(int(lease_s * 1000 * LEASE_DRIFT)) + 1 if top else 0


class Transport(abc.ABC):
    """How a leader reaches a follower (the node layer implements it over HTTP)."""

    @abc.abstractmethod
    async def append(self, node: str, header: dict[str, Any], data: list[bytes]) -> dict[str, Any]:
        """Send ``data`` (the pieces of ``header``) to ``node``; its answer, or
        FencedError (a newer epoch exists), ConnectionError or TimeoutError."""


class Shipper:
    """Replication of one partition, led by this node in ``epoch``."""

    def __init__(self, table_id: str, pid: int, epoch: int, base: int, start: Position, followers: list[str],
                 transport: Transport, lease_s: float, *, on_fenced: Callable[[Shipper], None],
                 clock: Callable[[], int], monotonic: Callable[[], float] = time.monotonic,
                 catalog: Catalog | None = None):
        """``on_fenced(shipper)``: a follower answered a newer epoch, so this node steps down (the
        fencing of RFC 0010 §5); ``clock()``: this node's HLC present, sent with every round (the
        clock floor the followers keep): both required, neither has a safe default."""
        self.table_id, self.pid, self.epoch, self.base, self.start = table_id, pid, epoch, base, start
        self.clock = clock  # this node's HLC present: sent with every round
        self.catalog = catalog  # where the partition's epoch history is (None: no segment row checks it)
        self.monotonic = monotonic  # the lease's time (a simulation runs it on virtual time)
        self.followers = list(followers)
        self.transport, self.lease_s, self.on_fenced = transport, lease_s, on_fenced
        self.needed = (len(self.followers) + 1) // 2  # followers that must hold a group (+ this node)
        self.segs: dict[int, ActiveSegment] = {}  # seq -> ActiveSegment held here (active or sealed)
        self.inflight: dict[int, tuple[int, int, bytes]] = {}  # seq -> (segid, offset, bytes)
        self.fenced: int | None = None
        self.closed = False
        self.want_clock = 0  # reads wait for a round carrying this clock to a majority (``cover``)
        self._progress = asyncio.Event()
        self._links = {n: _Link(self, n) for n in self.followers}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start_links(self) -> None:
        self._tasks = {n: asyncio.ensure_future(link.run()) for n, link in self._links.items()}

    def set_followers(self, followers: list[str]) -> None:
        """A new replica set (rebalancing adds a follower, later drops one): links come and go,
        and the majority is counted over the new set from now on (one change at a time, so
        every majority of the old set meets every majority of the new)."""
        for n in [n for n in self._links if n not in followers]:
            del self._links[n]
            t = self._tasks.pop(n, None)
            if t is not None:
                t.cancel()
        for n in followers:
            if n not in self._links:
                self._links[n] = _Link(self, n)
                self._tasks[n] = asyncio.ensure_future(self._links[n].run())
        self.followers = list(followers)
        self.needed = (len(self.followers) + 1) // 2
        self.progressed()

    # -- segments -------------------------------------------------------------------------------

    def register(self, seq: int, seg: ActiveSegment) -> None:
        """``seg`` (an ActiveSegment of this partition, position ``seq``) is shipped from now on."""
        self.segs[seq] = seg
        seg.file.mirror_to(partial(self.mirror, seq, seg.segid))
        self.wake()

    async def lead_checks(self) -> list[Check]:
        """What a new segment row of this partition is written with: the partition's epoch
        history as read now, which an election writes with each new epoch. A leader replaced
        while it was stopped (nobody fenced it) must not begin a segment: no promotion would
        move its row, which would stand for a log of its own that its fences answer in place of
        the newer one it follows (simulation seed 36, RFC 0010 invariant O). FencedError (and
        this shipper steps down) when the history already records a newer epoch."""
        if self.catalog is None:
            return []
        key = epochs_key(self.table_id, self.pid)
        e = await self.catalog.get(key)
        epochs = History.from_bytes(e.value, key).epochs if e is not None else []
        if epochs and epochs[-1].epoch > self.epoch:
            self.fence(epochs[-1].epoch)
            raise FencedError(f"partition {self.pid}: epoch {epochs[-1].epoch} was elected after {self.epoch}",
                              epochs[-1].epoch)
        return [Check(key, e.version if e is not None else 0)]

    def unregister(self, segid: int) -> None:
        for seq, seg in list(self.segs.items()):
            if seg.segid == segid:
                del self.segs[seq]
                self.inflight.pop(seq, None)

    # -- the write path -------------------------------------------------------------------------

    async def mirror(self, seq: int, segid: int, logical: int, batch: list[bytes | memoryview]) -> None:
        """Ship one group and wait until ``needed`` followers hold it (MirrorError once fenced)."""
        data = b"".join(batch)  # one copy: the appenders may reuse their buffers once acknowledged
        self.inflight[seq] = (segid, logical, data)
        self.wake()
        await self.wait_for(Position(seq, logical + len(data)))

    async def wait_for(self, target: Position) -> None:
        while True:
            if self.fenced is not None or self.closed:
                raise MirrorError(f"partition {self.table_id}/{self.pid}: no longer led here "
                                  f"(epoch {self.epoch}{f', fenced by {self.fenced}' if self.fenced else ''})")
            if sum(1 for link in self._links.values() if link.pos is not None and link.pos >= target) >= self.needed:
                return
            ev = self._progress
            await ev.wait()

    def progressed(self) -> None:
        ev, self._progress = self._progress, asyncio.Event()
        ev.set()

    def wake(self) -> None:
        for link in self._links.values():
            link.wake.set()

    def fence(self, epoch: int) -> None:
        if self.fenced is None:
            self.fenced = epoch
            log.warning("event=leader_fenced table=%s partition=%d epoch=%d by=%d", self.table_id, self.pid,
                        self.epoch, epoch)
            self.progressed()
            self.on_fenced(self)

    # -- reads ----------------------------------------------------------------------------------

    def lease_ok(self) -> bool:
        """Whether a majority answered within the lease (this node counts as one)."""
        if self.fenced is not None or self.closed:
            return False
        floor = self.monotonic() - self.lease_s
        return sum(1 for link in self._links.values() if link.acked_at >= floor) >= self.needed

    def reach(self) -> int:
        """The highest read T this leader may serve now (RFC 0010 §5, "Clocks"): the clock its
        latest rounds within the lease carried, as a majority of its replicas took them, plus
        the lease — what the next election's floor (``clock_floor``, from the clocks a majority
        of the replicas answer) lies above, whatever this node's clock did since those rounds
        (it may have jumped ahead, or observed a T from a node ahead of it). 0: no lease."""
        if self.needed == 0:
            return MAX_TS
        floor = self.monotonic() - self.lease_s
        clocks = sorted((link.acked_clock for link in self._links.values() if link.acked_at >= floor), reverse=True)
        if len(clocks) < self.needed:
            return 0
        return clocks[self.needed - 1] + ts_from_ms(int(self.lease_s * 1000 * LEASE_DRIFT))

    async def cover(self, T: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until a read at T lies within :meth:`reach`: a round
        carrying this node's present (at or above T: the clock observed T) acknowledged by a
        majority. False when it did not come (no majority answers, or no longer leading)."""
        self.want_clock = max(self.want_clock, T)
        self.wake()
        try:
            async with asyncio.timeout(timeout):
                while self.reach() < T:
                    if self.fenced is not None or self.closed:
                        return False
                    await self._progress.wait()
        except TimeoutError:
            return False
        return True

    def status(self) -> dict[str, Any]:
        now = self.monotonic()
        return {"epoch": self.epoch, "lease": self.lease_ok(), "fenced": self.fenced, "end": list(self.end()),
                "followers": {n: {"pos": None if link.pos is None else list(link.pos),
                                  "lag_bytes": link.lag_bytes(), "sent_bytes": link.sent_bytes,
                                  "ack_age_s": round(now - link.acked_at, 3) if link.acked_at > 0 else None}
                              for n, link in self._links.items()}}

    def end(self) -> Position:
        """This leader's durable log end."""
        if not self.segs:
            return NOTHING
        seq = max(self.segs)
        return Position(seq, self.segs[seq].file.durable_size)

    async def close(self) -> None:
        self.closed = True
        self.progressed()
        for t in self._tasks.values():
            t.cancel()
        for t in self._tasks.values():
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - a link's last error is logged by it
                pass
        # The files keep this shipper as their mirror: a group still flushing fails with
        # MirrorError instead of counting as durable without a majority.


class _Link:
    """One follower: what it holds (``pos``), and the loop sending it the rest."""

    def __init__(self, sh: Shipper, node: str):
        self.sh, self.node = sh, node
        self.pos: Position | None = None  # unknown until it answered
        self.acked_at = -1e9
        self.acked_clock = 0  # the leader's clock the round acknowledged at ``acked_at`` carried
        self.wake = asyncio.Event()
        self.sent_bytes = 0

    def lag_bytes(self) -> int | None:
        if self.pos is None:
            return None
        end = self.sh.end()
        if self.pos.seq == end.seq:
            return max(end.offset - self.pos.offset, 0)
        return sum(seg.file.durable_size for q, seg in self.sh.segs.items() if q > self.pos.seq) + \
            max((self.sh.segs[self.pos.seq].file.durable_size - self.pos.offset) if self.pos.seq in self.sh.segs
                else 0, 0)

    async def run(self) -> None:
        delay = 0.05
        beat = self.sh.lease_s / 3
        while not self.sh.closed and self.sh.fenced is None:
            try:
                header, data = await self._collect() if self.pos is not None else (self._header([]), [])
                if not data and self.pos is not None and self.sh.monotonic() - self.acked_at < beat and \
                        self.acked_clock >= self.sh.want_clock:  # else a read waits for a round (cover)
                    self.wake.clear()
                    try:  # asyncio.timeout, not wait_for: on 3.11 a cancel that meets the wake
                        async with asyncio.timeout(beat):  # was swallowed, and the link lived on
                            await self.wake.wait()
                    except TimeoutError:
                        pass
                    continue
                t0 = self.sh.monotonic()
                got = await self.sh.transport.append(self.node, header, data)
                self.pos = Position.of(got["pos"])
                self.acked_at, self.acked_clock = t0, int(header["clock"])
                self.sent_bytes += sum(len(d) for d in data)
                self.sh.progressed()
                delay = 0.05
            except FencedError as e:
                self.sh.fence(e.promised)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a follower down or slow: try again, it is caught up then
                if self.pos is not None:
                    log.info("event=replica_unreachable table=%s partition=%d node=%s error=%r", self.sh.table_id,
                             self.sh.pid, self.node, e)
                self.pos = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _header(self, pieces: list[list[int]]) -> dict[str, Any]:
        sh = self.sh
        return {"table": sh.table_id, "pid": sh.pid, "epoch": sh.epoch, "base": sh.base, "start": list(sh.start),
                "clock": sh.clock(), "pieces": pieces}

    async def _collect(self) -> tuple[dict[str, Any], list[bytes]]:
        """The pieces the follower lacks next, in log order, up to CHUNK bytes."""
        pieces: list[list[int]] = []
        data: list[bytes] = []
        size = 0
        assert self.pos is not None  # run() collects only for a follower that answered
        seq, off = self.pos
        for _ in range(64):
            if size >= CHUNK:
                break
            later = sorted(q for q in self.sh.segs if q > seq)
            if seq not in self.sh.segs:  # offloaded (an object: nothing to ship) or nothing yet
                if not later:
                    break
                seq, off = later[0], 0
            seg = self.sh.segs[seq]
            durable = seg.file.durable_size
            fl = self.sh.inflight.get(seq)
            if off < durable:
                try:
                    chunk = await _whole_records(seg.file, off, durable, CHUNK - size)
                except ClosedError:
                    break  # offloaded meanwhile: the next round skips it
                if not chunk:
                    break
                pieces.append([seg.segid, seq, off, len(chunk)])
                data.append(chunk)
                off += len(chunk)
                size += len(chunk)
                continue
            if fl is not None and fl[1] == off and fl[1] + len(fl[2]) > off:
                pieces.append([fl[0], seq, off, len(fl[2])])
                data.append(fl[2])
                off += len(fl[2])
                size += len(fl[2])
                continue
            if later and (fl is None or fl[1] + len(fl[2]) <= off):
                seq, off = later[0], 0  # this segment is complete (rolled): go on to the next
                continue
            break
        return self._header(pieces), data


async def _whole_records(f: ActiveFile, off: int, end: int, budget: int) -> bytes:
    """Durable bytes of ``f`` from ``off`` (a record boundary) up to ``end``, at most ``budget``
    of them unless the first record alone is bigger, cut after the last whole write-ahead
    record: a follower's copy then always ends between records, so it is a valid active
    segment whenever it is promoted."""
    data = await f.read(off, min(end - off, max(budget, REC.size)))
    cut = whole_prefix(data)
    if cut == 0 and len(data) >= REC.size:  # one record bigger than the budget: all of it
        need = REC.size + REC.unpack_from(data, 0)[3]
        data = await f.read(off, min(need, end - off))
        cut = whole_prefix(data)
    return data[:cut]


def whole_prefix(data: bytes) -> int:
    """The length of the longest prefix of ``data`` made of whole records."""
    pos, n = 0, len(data)
    while n - pos >= REC.size:
        blen = REC.unpack_from(data, pos)[3]
        if n - pos - REC.size < blen:
            break
        pos += REC.size + blen
    return pos
