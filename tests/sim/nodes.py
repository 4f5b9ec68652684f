"""The simulated parts of the seeded fault simulation (tests/sim/world.py runs them): a network
between processes on virtual time (cut one way or both, slow, lossy, duplicating), and nodes
— the real ``TerrascaleFS`` and ``Database`` on in-memory disks that lose what was not synced
at a crash (torn, optionally), fail with EIO, or fill up."""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from catalog.errors import CatalogError
from rowstore.db.database import Database, TablesConfig
from rowstore.errors import RowstoreError
from rowstore.replication.follower import SegmentPiece
from rowstore.replication.leader import Transport
from rowstore.segments.position import Position
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice
from terrafs.entropy import Entropy
from terrafs.errors import TerrafsError, TransientStorageError
from terrafs.fs import FsConfig, TerrascaleFS
from node.cluster.leading import Step, Take, how_to_take, lead, reconcile_step
from tests.sim.loop import in_process
from tests.sim.views import NodeCatalog, NodeObjects

if TYPE_CHECKING:
    from tests.sim.world import World

SCHEMA = "id int64 primary key, b int64"
ROWS = 8  # rows per batch: keys b * ROWS .. b * ROWS + ROWS - 1, column b = the batch id
PARTS = 2  # the table's partitions: a batch's rows fall in both, each led on its own
LEASE_S = 0.5
FAILURE_S = 1.0  # a node down this long is dead to the driver
TIMEOUT_S = 1.0  # a message or answer lost: the sender learns it this late
ANSWER_S = 3.0  # a request not answered this long (its node stopped, say) is given up on
CATALOG_RTT_S = 0.005  # a read of the catalog (a Raft group over the network)
WALL0_MS = 1_700_000_000_000


class Violation(AssertionError):
    """An invariant of the replicated log does not hold."""


@dataclass
class Faults:
    crash: float = 0.25  # per second of virtual time: a node is killed
    partition: float = 0.2  # per second: a link is cut (one way or both) for a while
    clock_jump: float = 0.05  # per second: a node's wall clock jumps
    slow: float = 0.3  # per second: a link turns slow (each message 30-300 ms late) for a while
    slow_node: float = 0.3  # per second: a node turns slow (a slow disk: every message to it late) for long
    drop: float = 0.01  # per message (either leg)
    duplicate: float = 0.01  # per message
    delay_ms: tuple[int, int] = (0, 15)
    tear: float = 0.5  # a crash keeps a torn unsynced tail
    disk_error: float = 0.03  # per second: a node's disk fails every write and sync (EIO) for a while
    disk_full: float = 0.05  # per second: a node's disk fills (ENOSPC) until seal, offload and GC free it
    pause: float = 0.1  # per second: a node's process stops (SIGSTOP) for 0.1-3 s
    # per second: the catalog answers nothing for 0.2-1.5 s (a Raft election). Off unless asked
    # (``--catalog-stall``), drawn from a generator of its own: the seeds kept for earlier bugs
    # replay as they did.
    catalog_stall: float = 0.0
    # per second: one node's own path to the catalog stalls, fails or loses answers for 0.2-2 s,
    # and to the object store fails (tests/sim/views.py). Off unless asked, likewise.
    node_catalog: float = 0.0
    node_objects: float = 0.0
    # the share of work handed to threads that completes late, out of the order it was handed
    # over (tests/sim/loop.py). Off unless asked, likewise.
    threads: float = 0.0


@dataclass
class Place:
    leader: str
    replicas: list[str]
    epoch: int
    base: int
    start: Position


class Net:
    def __init__(self, world: "World"):
        self.w, self.cut = world, set()  # (from, to): messages from -> to are lost
        self.slow: dict[tuple[str, str], int] = {}  # (from, to) -> ms every message takes more
        self.slow_node: dict[str, int] = {}  # node -> ms every message to it takes more

    def _lost(self, a: str, b: str, rng: random.Random) -> bool:
        return (a, b) in self.cut or rng.random() < self.w.faults.drop

    async def _delay(self, a: str, b: str, rng: random.Random) -> None:
        lo, hi = self.w.faults.delay_ms
        extra = self.slow.get((a, b), 0) + self.slow_node.get(b, 0)
        await asyncio.sleep((rng.randint(lo, hi) + extra) / 1000)

    async def call(self, src: str, dst: str, handler, rng: random.Random | None = None):
        """``await handler()`` run as a task of ``dst``'s process; its answer back to ``src``.
        ``rng``: the message's own randomness (default: the world's schedule)."""
        rng = rng or self.w.rng
        node = self.w.nodes.get(dst)
        if node is None or not node.up or self._lost(src, dst, rng):
            await asyncio.sleep(TIMEOUT_S)
            raise ConnectionError(f"{src} -> {dst}: no answer")
        await self._delay(src, dst, rng)
        if not node.up:
            raise ConnectionError(f"{dst} is down")
        task = in_process(node.process, handler())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # the sender may be gone
        if rng.random() < self.w.faults.duplicate:
            dup = in_process(node.process, handler())
            dup.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.wait([task], timeout=ANSWER_S)
        if not task.done():
            raise ConnectionError(f"{src} -> {dst}: no answer within {ANSWER_S:g} s")  # it may still land
        if task.cancelled():
            raise ConnectionError(f"{dst} died during the request")
        if self._lost(dst, src, rng):
            task.exception()  # retrieved: the effect happened, the answer is lost
            await asyncio.sleep(TIMEOUT_S)
            raise ConnectionError(f"{dst} -> {src}: answer lost")
        await self._delay(dst, src, rng)
        return task.result()


class SimTransport(Transport):
    def __init__(self, world: "World", me: str):
        self.w, self.me = world, me

    async def append(self, node: str, header: dict, data: list[bytes]) -> dict:
        pieces = [SegmentPiece(s, q, o, bytes(d)) for (s, q, o, _), d in zip(header["pieces"], data)]
        h = dict(header)
        return await self.w.net.call(self.me, node, lambda: self.w.nodes[node].db.leadership.append(
            h["table"], h["pid"], h["epoch"], h["base"], Position(*h["start"]), pieces, self.me, h["clock"]))


class Node:
    def __init__(self, world: "World", name: str):
        self.w, self.name = world, name
        self.block, self.volatile = MemoryBlockDevice(), MemoryBlockDevice(durable=False)
        # its process's ids and random draws: seeded, apart from every other draw of the world
        self.entropy = Entropy(f"{world.seed}/{name}")
        self.catalog = NodeCatalog(world.catalog, world.loop, name, self.entropy)  # its own path: faults of its own
        self.objects = NodeObjects(world.objects, world.loop, name)
        self.inc, self.up, self.down_at, self.skew_ms = 0, False, 0.0, 0
        self.paused_at = 0.0  # when its process was last stopped (SIGSTOP)
        self.db: Database | None = None
        self._starting: asyncio.Event | None = None
        self._busy: set[int] = set()  # partitions being taken (its process's, as NodeReplication's)
        self._outvoted: dict[int, int] = {}  # pid -> the epoch a follower fenced its leadership with

    @property
    def process(self) -> str:
        return f"{self.name}#{self.inc}"

    def now_ms(self) -> int:
        return WALL0_MS + int(self.w.loop.time() * 1000) + self.skew_ms

    async def start(self) -> None:
        """Start the node's process; one already starting (its open waiting for a stalled
        catalog) is waited for, never doubled: two processes on one data directory is not a
        fault a node can meet (its lock on the directory refuses the second)."""
        if self._starting is not None:
            await self._starting.wait()
            return
        self._starting = asyncio.Event()  # no task or future of its own: the seeds' schedules stay as they were
        try:
            self.inc += 1
            self._busy, self._outvoted = set(), {}  # a new process knows nothing of the last one's
            try:
                await in_process(self.process, self._open())
            except (CatalogError, TransientStorageError):  # its process exits: nothing of it runs on
                self.w.loop.kill(self.process)
                self.db = None
                raise
            self.up = True
        finally:
            self._starting.set()
            self._starting = None
        in_process(self.process, self._reconcile())
        in_process(self.process, self._maintain(random.Random(self.w.rng.randrange(1 << 30))))

    async def _open(self) -> None:
        fs = TerrascaleFS(self.catalog, self.block, self.volatile, self.objects,
                          config=FsConfig(node_id=self.name, flush=ActiveConfig(flush_ms=0.5), page_size=0),
                          entropy=self.entropy)
        await fs.open()
        cfg = TablesConfig(partitions=PARTS, ack_timeout_s=2.0, replica_lease_s=LEASE_S,
                           prepare_timeout_s=2.0)  # a coordinator silent this long: decided from the catalog
        db = Database(fs, cfg, now_ms=self.now_ms, monotonic=self.w.loop.time)

        async def owns(d):
            return {}  # replicated: served only once promoted
        await db.open(owns)
        self.db = db

    def crash(self) -> None:
        self.up, self.down_at = False, self.w.loop.time()
        self.w.loop.kill(self.process)
        tear = self.w.rng.randrange(1 << 30) if self.w.rng.random() < self.w.faults.tear else None
        self.block.crash(tear_seed=tear)
        self.volatile.crash()
        self.db = None

    async def _maintain(self, rng: random.Random) -> None:
        """The node's background jobs: after a disk error, stepping down or taking writes again
        (``resume_writes``); checkpoints (with the merges they start) often; seal, offload and
        a GC pass now and then — on every node, leader or not, as the daemon runs them."""
        while True:
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            jobs = [self.db.resume_writes, self.db.checkpoint]
            if rng.random() < 0.3:
                jobs += [self.db.seal, self.db.offload, self.db.collect_garbage]
            for job in jobs:
                try:
                    await job()
                except (RowstoreError, TerrafsError, ConnectionError, CatalogError) as e:
                    self.w.log("job_failed", node=self.name, job=job.__name__, error=repr(e)[:100])

    async def _reconcile(self) -> None:
        """The node's reconcile (``NodeReplication.reconcile``, by the rules of
        ``node/cluster/leading.py``): every 0.2 s, the placement read from the catalog — a round
        trip, during which the node goes on serving (a process resumed after SIGSTOP answers
        what waited for it meanwhile) — then it takes each partition the placement names it
        leader of and stops leading the others."""
        while True:
            await asyncio.sleep(0.2)
            await asyncio.sleep(CATALOG_RTT_S)
            d = self.w.table
            for pid, p in list(self.w.place.items()):
                sh = self.db.leadership.shipper(d.table_id, pid)
                step = reconcile_step(self.name, p.leader, p.epoch, p.replicas, sh)
                try:
                    if step is Step.TAKE:
                        await self.take(pid, p)
                    elif step is Step.DEMOTE:
                        await self.db.leadership.demote(d.table_id, pid)
                except Exception as e:  # noqa: BLE001 - as the controller's loop: logged, tried again next time
                    self.w.log("reconcile_failed", node=self.name, pid=pid, error=repr(e)[:100])

    async def take(self, pid: int, p: Place | None = None) -> None:
        """Lead ``pid`` as placement ``p`` says (``NodeReplication.take``; the one the decision
        was made on — read now when told by an election, as ``take_if_mine`` reads it): at once
        when its epoch came from an election naming this node, after an election of its own when
        it led at that epoch before (a restart) or was fenced beyond it, not yet when fenced
        just now. Never at an epoch placed with another leader: two leaders of one epoch."""
        p = p or self.w.place[pid]
        if pid in self._busy or p.leader != self.name:
            return
        self._busy.add(pid)
        try:
            d = self.w.table
            how = await how_to_take(self.db, self.name, d.table_id, pid, p.epoch, self._outvoted.get(pid, 0),
                                    self.w.loop.time, FAILURE_S)
            if how is Take.WAIT:
                return
            if how is Take.ELECT:
                was = p.epoch
                await self.w.elect(pid, exclude=set(), src=self.name)
                p = self.w.place[pid]
                if p.leader != self.name or p.epoch == was:
                    return
            await lead(self.db, d, pid, p.epoch, p.base, p.start, list(p.replicas[1:]),
                       SimTransport(self.w, self.name), LEASE_S, self._fenced)
        finally:
            self._busy.discard(pid)

    def _fenced(self, sh) -> None:
        """A follower fenced this leader with a later epoch: step down, and remember the epoch."""
        self._outvoted[sh.pid] = max(self._outvoted.get(sh.pid, 0), sh.fenced or 0)
        asyncio.ensure_future(self.db.leadership.demote(sh.table_id, sh.pid))
