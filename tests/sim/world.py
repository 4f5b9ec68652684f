"""A simulated cluster for the seeded fault simulation: the real leader (``Shipper``), follower
(``ReplicaStore``), promotion and demotion (``Leadership``), commit path (``Database``) and
election rules (``choose_leader``, ``clock_floor``, the epoch history) of three nodes in one
process, over a simulated network and simulated disks, driven by one seeded RNG on virtual time
(``tests/sim/loop.py``). What the node layer adds over HTTP — the driver's elections, each
node's reconcile — is modelled here in a few lines with the same rules.

Faults: kill -9 (unsynced bytes lost, optionally a torn tail), restarts, network partitions
(both ways or one way), dropped, duplicated and delayed messages (so reordered), slow links and
slow nodes, wall-clock jumps, a disk failing every write and sync (EIO) for a while, a disk
filling up (ENOSPC) until space comes back. Invariants (``World.check_*``): no acknowledged
write lost, no row that was never written, replicas equal to the leader's log once caught up,
at most one leader holding a read lease at any moment, an ``as_of`` read repeated gives the same
rows, the change feed holds every acknowledged write exactly once."""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from catalog.abc import Check, Put
from catalog.memory import MemoryCatalog
from node.cluster.controller import choose_leader
from rowstore.db.committer import COMMITTED, txn_key
from rowstore.db.database import Database, TablesConfig
from rowstore.errors import FencedError, RowstoreError
from rowstore.replication.epochs import Epoch, History, epochs_key
from rowstore.replication.follower import Piece
from rowstore.replication.leader import Transport, clock_floor
from rowstore.replication.position import NOTHING, Position
from rowstore.segments.wal import DECIDED, SPANS_NODES
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.catalog_ops import commit
from terrafs.errors import TerrafsError
from terrafs.fs import FsConfig, TerrascaleFS
from tests.sim.loop import in_process

SCHEMA = "id int64 primary key, b int64"
ROWS = 8  # rows per batch: keys b * ROWS .. b * ROWS + ROWS - 1, column b = the batch id
LEASE_S = 0.5
FAILURE_S = 1.0  # a node down this long is dead to the driver
TIMEOUT_S = 1.0  # a message or answer lost: the sender learns it this late
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


@dataclass
class Place:
    leader: str
    replicas: list[str]
    epoch: int
    base: int
    start: Position
    inc: int  # the leader's incarnation when elected


class Net:
    def __init__(self, world: "World"):
        self.w, self.cut = world, set()  # (from, to): messages from -> to are lost
        self.slow: dict[tuple[str, str], int] = {}  # (from, to) -> ms every message takes more
        self.slow_node: dict[str, int] = {}  # node -> ms every message to it takes more

    def _lost(self, a: str, b: str) -> bool:
        return (a, b) in self.cut or self.w.rng.random() < self.w.faults.drop

    async def _delay(self, a: str, b: str) -> None:
        lo, hi = self.w.faults.delay_ms
        extra = self.slow.get((a, b), 0) + self.slow_node.get(b, 0)
        await asyncio.sleep((self.w.rng.randint(lo, hi) + extra) / 1000)

    async def call(self, src: str, dst: str, handler):
        """``await handler()`` run as a task of ``dst``'s process; its answer back to ``src``."""
        node = self.w.nodes.get(dst)
        if node is None or not node.up or self._lost(src, dst):
            await asyncio.sleep(TIMEOUT_S)
            raise ConnectionError(f"{src} -> {dst}: no answer")
        await self._delay(src, dst)
        if not node.up:
            raise ConnectionError(f"{dst} is down")
        task = in_process(node.process, handler())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # the sender may be gone
        if self.w.rng.random() < self.w.faults.duplicate:
            dup = in_process(node.process, handler())
            dup.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.wait([task])
        if task.cancelled():
            raise ConnectionError(f"{dst} died during the request")
        if self._lost(dst, src):
            task.exception()  # retrieved: the effect happened, the answer is lost
            await asyncio.sleep(TIMEOUT_S)
            raise ConnectionError(f"{dst} -> {src}: answer lost")
        await self._delay(dst, src)
        return task.result()


class SimTransport(Transport):
    def __init__(self, world: "World", me: str):
        self.w, self.me = world, me

    async def append(self, node: str, header: dict, data: list[bytes]) -> dict:
        pieces = [Piece(s, q, o, bytes(d)) for (s, q, o, _), d in zip(header["pieces"], data)]
        h = dict(header)
        return await self.w.net.call(self.me, node, lambda: self.w.nodes[node].db.leadership.append(
            h["table"], h["pid"], h["epoch"], h["base"], Position(*h["start"]), pieces, self.me, h["clock"]))


class Node:
    def __init__(self, world: "World", name: str):
        self.w, self.name = world, name
        self.block, self.volatile = MemoryBlockDevice(), MemoryBlockDevice(durable=False)
        self.inc, self.up, self.down_at, self.skew_ms = 0, False, 0.0, 0
        self.db: Database | None = None

    @property
    def process(self) -> str:
        return f"{self.name}#{self.inc}"

    def now_ms(self) -> int:
        return WALL0_MS + int(self.w.loop.time() * 1000) + self.skew_ms

    async def start(self) -> None:
        self.inc += 1
        await in_process(self.process, self._open())
        self.up = True
        in_process(self.process, self._reconcile())
        in_process(self.process, self._maintain(random.Random(self.w.rng.randrange(1 << 30))))

    async def _open(self) -> None:
        fs = TerrascaleFS(self.w.catalog, self.block, self.volatile, self.w.objects,
                          config=FsConfig(node_id=self.name, flush=ActiveConfig(flush_ms=0.5), page_size=0))
        await fs.open()
        db = Database(fs, TablesConfig(partitions=1), now_ms=self.now_ms, monotonic=self.w.loop.time)
        db.replicas.lease_s = LEASE_S
        db.committer.ack_timeout_s = 2.0
        db.participant.timeout_s = 2.0  # a coordinator silent this long: decided from the catalog

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
                except (RowstoreError, TerrafsError, ConnectionError) as e:
                    self.w.log("job_failed", node=self.name, job=job.__name__, error=repr(e)[:100])

    async def _reconcile(self) -> None:
        """Stop leading what the placement gives to another epoch (the node's reconcile)."""
        while True:
            await asyncio.sleep(0.2)
            p, d = self.w.place, self.w.table
            sh = self.db.leadership.shipper(d.table_id, 0)
            if sh is not None and (p.leader != self.name or p.epoch != sh.epoch):
                await self.db.leadership.demote(d.table_id, 0)


@dataclass
class Ledger:
    acked: dict[int, int] = field(default_factory=dict)  # batch -> commit_ts
    maybe: set[int] = field(default_factory=set)  # answered with an error: may or may not be there
    reads: list[tuple[int, frozenset]] = field(default_factory=list)  # (T, rows seen at T)


class World:
    def __init__(self, seed: int, loop, faults: Faults | None = None, seconds: float = 30.0, writers: int = 3):
        self.seed, self.loop, self.rng = seed, loop, random.Random(seed)
        self.faults, self.seconds, self.writers = faults or Faults(), seconds, writers
        self.catalog, self.objects = MemoryCatalog(), MemoryObjectStore()
        self.nodes = {n: Node(self, n) for n in ("n1", "n2", "n3")}
        self.net, self.ledger, self.trace = Net(self), Ledger(), []
        self.place: Place | None = None
        self.table = None
        self.next_batch = 0
        self.elections = 0

    def log(self, what: str, **kw) -> None:
        self.trace.append(f"{self.loop.time():9.3f} {what} " + " ".join(f"{k}={v}" for k, v in kw.items()))

    # -- the run --------------------------------------------------------------------------------

    async def run(self) -> None:
        for n in self.nodes.values():
            await n.start()
        self.table = await self.nodes["n1"].db.create_table("t", SCHEMA, partitions=1)
        self.place = Place("n1", ["n1", "n2", "n3"], 0, 0, NOTHING, 0)
        await self.elect(exclude=set(), first=True)
        stop = asyncio.Event()
        jobs = [in_process("driver", self._driver(stop)), in_process("nemesis", self._nemesis(stop)),
                in_process("lease-watch", self._watch_leases(stop))]
        jobs += [in_process(f"client{i}", self._writer(i, stop)) for i in range(self.writers)]
        jobs += [in_process("coordinator", self._coordinator(stop))]
        await asyncio.sleep(self.seconds)
        stop.set()
        await self._heal()
        for j in jobs:
            j.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await self._settle()
        await self.check_all()

    async def _heal(self) -> None:
        self.net.cut.clear()
        self.net.slow.clear()
        self.net.slow_node.clear()
        for n in self.nodes.values():
            n.block.broken, n.block.capacity = False, None
        self.faults.drop = self.faults.duplicate = 0.0
        for n in self.nodes.values():
            if not n.up:
                await n.start()
                self.log("restart", node=n.name, inc=n.inc)

    async def _settle(self) -> None:
        """Until a leader leads with every follower caught up (every fault healed)."""
        for _ in range(600):
            await self._drive_once(set())
            sh = self._shipper()
            if sh is not None and sh.lease_ok() and all(  # lag 0 is not enough: a follower may
                    # hold all of an offloaded segment and not yet the next one's first group
                    (p := sh.status()["followers"][f]["pos"]) is not None and Position(*p) >= sh.end()
                    for f in sh.followers):
                self.settled_at = sh.end()
                return
            await asyncio.sleep(0.1)
        raise Violation(f"no leader with caught-up followers 60 s after healing (place {self.place})")

    def _shipper(self):
        n = self.nodes[self.place.leader]
        return n.db.leadership.shipper(self.table.table_id, 0) if n.up and n.db else None

    # -- the driver: elections (node/cluster/controller.py's rules) -----------------------------

    async def _driver(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.1)
            dead = {n.name for n in self.nodes.values() if not n.up and self.loop.time() - n.down_at > FAILURE_S}
            await self._drive_once(dead)

    async def _drive_once(self, dead: set[str]) -> None:
        p, leader = self.place, self.nodes[self.place.leader]
        if p.leader in dead:
            await self.elect(exclude=dead)
        elif leader.up and (leader.inc != p.inc or self._shipper() is None or self._shipper().fenced is not None):
            await self.elect(exclude=dead)  # restarted, or stepped down: it takes it through an election

    async def elect(self, exclude: set[str], first: bool = False) -> bool:
        p, tid = self.place, self.table.table_id
        voters, need = [n for n in p.replicas if n not in exclude], 2
        if len(voters) < need:
            return False
        epoch = p.epoch + 1
        for _ in range(3):
            got = await asyncio.gather(*[self.net.call("driver", n, lambda n=n, e=epoch: self.nodes[
                n].db.leadership.fence(tid, 0, e)) for n in voters], return_exceptions=True)
            ok = {n: g for n, g in zip(voters, got) if isinstance(g, dict)}
            if len(ok) >= need:
                break
            promised = [g.promised for g in got if isinstance(g, FencedError) and g.promised >= epoch]
            if not promised or len(ok) + len(promised) < need:
                return False
            epoch = max(promised) + 1
        else:
            return False
        chosen = choose_leader(ok, need, None, p.leader)
        base, start = int(ok[chosen]["last"]), Position.of(ok[chosen]["pos"])
        if not await self._record(epoch, base, start, clock_floor(ok.values(), LEASE_S)):
            return False
        node = self.nodes[chosen]
        self.place = Place(chosen, [chosen, *[n for n in p.replicas if n != chosen]], epoch, base, start, node.inc)
        self.elections += 1
        self.log("elected", leader=chosen, epoch=epoch, base=base, start=list(start),
                 answers={n: (a["last"], a["pos"]) for n, a in ok.items()})
        followers = self.place.replicas[1:]

        def fenced(sh, node=node):
            asyncio.ensure_future(node.db.leadership.demote(sh.table_id, sh.pid))
        try:
            await self.net.call("driver", chosen, lambda: node.db.leadership.promote(
                self.table, 0, epoch, base, start, followers, SimTransport(self, chosen), LEASE_S, on_fenced=fenced))
        except (ConnectionError, RowstoreError, TerrafsError) as e:
            self.log("promote_failed", node=chosen, error=repr(e)[:120])
        return True

    async def _record(self, epoch: int, base: int, start: Position, floor: int) -> bool:
        """The epoch history, as the election writes it with the placement."""
        key = epochs_key(self.table.table_id, 0)
        e = await self.catalog.get(key)
        h = History.from_bytes(e.value, key) if e is not None else History([])
        res = await commit(self.catalog, [Check(key, e.version if e else 0)],
                           [Put(key, h.with_epoch(Epoch(epoch, base, start, floor)).to_bytes())])
        return res.committed

    # -- clients --------------------------------------------------------------------------------

    async def _writer(self, i: int, stop: asyncio.Event) -> None:
        rng = random.Random(self.rng.randrange(1 << 30))
        while not stop.is_set():
            b = self.next_batch
            self.next_batch += 1
            leader = self.place.leader
            keys = np.arange(b * ROWS, (b + 1) * ROWS, dtype=np.int64)
            rows = pa.table({"id": keys, "b": np.full(ROWS, b, np.int64)})
            self.ledger.maybe.add(b)  # until it is answered: a write in flight may land
            try:
                res = await self.net.call(f"client{i}", leader, lambda n=leader, rows=rows: self.nodes[n].db.upsert(
                    "t", rows))
                self.ledger.acked[b] = res.commit_ts
                self.ledger.maybe.discard(b)
            except (ConnectionError, RowstoreError, TerrafsError):
                pass
            if rng.random() < 0.05:
                await self._read()
            await asyncio.sleep(rng.randint(1, 30) / 1000)

    async def _coordinator(self, stop: asyncio.Event) -> None:
        """Batches of a transaction coordinated elsewhere (RFC 0010 §3) with this partition's
        leader as their one participant: reserve, prepare (given up after 0.4 s: then aborted,
        often while the prepare's append still waits for a majority), decide in the catalog,
        commit — the participant's path of a batch spanning nodes."""
        rng = random.Random(self.rng.randrange(1 << 30))
        while not stop.is_set():
            await asyncio.sleep(rng.randint(5, 60) / 1000)
            b = self.next_batch
            self.next_batch += 1
            self.ledger.maybe.add(b)
            try:
                ts = await self._transaction(b, DECIDED | SPANS_NODES | rng.getrandbits(60))
            except (ConnectionError, RowstoreError, TerrafsError):
                continue
            if ts is not None:
                self.ledger.acked[b] = ts
                self.ledger.maybe.discard(b)

    async def _transaction(self, b: int, txn: int) -> int | None:
        """One batch through the participant's two phases; its timestamp, or None if aborted."""
        leader, d = self.place.leader, self.table
        node = self.nodes[leader]
        if not node.up:
            raise ConnectionError(f"{leader} is down")
        part = node.db.participant
        keys = np.arange(b * ROWS, (b + 1) * ROWS, dtype=np.int64)
        rows = pa.table({"id": keys, "b": np.full(ROWS, b, np.int64)})
        r = await self.net.call("coordinator", leader, lambda: part.reserve(
            "t", d.table_id, d.schema.version, rows, 0, txn))
        try:
            await asyncio.wait_for(self.net.call("coordinator", leader, lambda: part.prepare(txn, r.ts)), 0.4)
        except (asyncio.TimeoutError, ConnectionError, RowstoreError, TerrafsError):
            await self.net.call("coordinator", leader, lambda: part.abort(txn))
            return None
        res = await commit(self.catalog, [Check(txn_key(txn), 0)], [Put(txn_key(txn), COMMITTED)])
        if not res.committed:
            return None  # the participant gave up on it and aborted first
        await self.net.call("coordinator", leader, lambda: part.commit(txn))
        return r.ts

    async def _read(self) -> None:
        leader = self.place.leader
        try:
            t, T = await self.net.call("reader", leader, lambda: self.nodes[leader].db.query(
                "t", limit=None, partitions=[0]))
        except (ConnectionError, RowstoreError, TerrafsError):
            return
        self.ledger.reads.append((T, _rows(t)))

    # -- faults ---------------------------------------------------------------------------------

    async def _nemesis(self, stop: asyncio.Event) -> None:
        f, step = self.faults, 0.05
        while not stop.is_set():
            await asyncio.sleep(step)
            r = self.rng.random
            if r() < f.crash * step:
                up = [n for n in self.nodes.values() if n.up]
                if len(up) >= 2:
                    lead = self.nodes[self.place.leader]
                    n = lead if lead.up and r() < 0.6 else self.rng.choice(up)  # leaders die more often
                    n.crash()
                    self.log("crash", node=n.name)
                    in_process("nemesis", self._restart_later(n, self.rng.uniform(0.2, 3.0)))
            if r() < f.partition * step:
                a, b = self.rng.sample(sorted(self.nodes), 2)
                links = {(a, b)} if r() < 0.5 else {(a, b), (b, a)}
                self.net.cut |= links
                self.log("cut", links=sorted(links))
                in_process("nemesis", self._heal_later(links, self.rng.uniform(0.1, 2.0)))
            if r() < f.slow * step:
                a, b = self.rng.sample(sorted(self.nodes), 2)
                if r() < 0.6:  # mostly the leader's link to one follower: a follower that lags
                    a = self.place.leader
                    b = self.rng.choice([n for n in sorted(self.nodes) if n != a])
                self.net.slow[(a, b)] = self.rng.randint(30, 300)
                self.log("slow", link=(a, b), ms=self.net.slow[(a, b)])
                in_process("nemesis", self._speed_up_later((a, b), self.rng.uniform(0.5, 5.0)))
            if r() < f.slow_node * step and not self.net.slow_node:
                n = self.rng.choice(sorted(self.nodes))
                self.net.slow_node[n] = self.rng.randint(50, 400)
                self.log("slow_node", node=n, ms=self.net.slow_node[n])
                in_process("nemesis", self._node_speed_up_later(n, self.rng.uniform(3.0, 12.0)))
            if r() < f.disk_error * step:
                n = self.rng.choice(sorted(self.nodes))
                self.nodes[n].block.broken = True
                self.log("disk_error", node=n)
                in_process("nemesis", self._disk_later(n, self.rng.uniform(0.1, 3.0), "broken", False))
            if r() < f.disk_full * step:
                n = self.rng.choice(sorted(self.nodes))
                blk = self.nodes[n].block
                blk.capacity = blk.used() + self.rng.randint(0, 64 << 10)
                self.log("disk_full", node=n, capacity=blk.capacity)
                in_process("nemesis", self._disk_later(n, self.rng.uniform(0.5, 5.0), "capacity", None))
            if r() < f.clock_jump * step:
                n = self.rng.choice(sorted(self.nodes))
                jump = self.rng.choice([-1, 1]) * self.rng.randint(1, 5000)
                self.nodes[n].skew_ms += jump
                self.log("clock_jump", node=n, ms=jump)

    async def _restart_later(self, n: Node, after: float) -> None:
        await asyncio.sleep(after)
        if not n.up:
            await n.start()
            self.log("restart", node=n.name, inc=n.inc)

    async def _disk_later(self, n: str, after: float, what: str, value) -> None:
        await asyncio.sleep(after)
        setattr(self.nodes[n].block, what, value)
        self.log("disk_ok", node=n)

    async def _node_speed_up_later(self, n: str, after: float) -> None:
        await asyncio.sleep(after)
        self.net.slow_node.pop(n, None)

    async def _speed_up_later(self, link: tuple, after: float) -> None:
        await asyncio.sleep(after)
        self.net.slow.pop(link, None)

    async def _heal_later(self, links: set, after: float) -> None:
        await asyncio.sleep(after)
        self.net.cut -= links
        self.log("heal", links=sorted(links))

    # -- invariants -----------------------------------------------------------------------------

    async def _watch_leases(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.01)
            self.check_leases()

    def check_leases(self) -> None:
        """At most one node serves reads of the partition at any moment."""
        holders = [n.name for n in self.nodes.values() if n.up and n.db is not None
                   and (sh := n.db.leadership.shipper(self.table.table_id, 0)) is not None and sh.lease_ok()]
        if len(holders) > 1:
            raise Violation(f"two leases at once: {holders}")

    async def check_all(self) -> None:
        leader = self.nodes[self.place.leader].db
        t, _ = await leader.query("t", limit=None, partitions=[0])
        got = _rows(t)
        batches = {}
        for k, b in got:
            if k // ROWS != b:
                raise Violation(f"row {k} carries batch {b}: never written")
            batches[b] = batches.get(b, 0) + 1
        lost = sorted(b for b in self.ledger.acked if batches.get(b) != ROWS)
        if lost:
            raise Violation(f"{len(lost)} acknowledged batches lost or torn: {lost[:10]}")
        phantom = sorted(b for b in batches if b not in self.ledger.acked and b not in self.ledger.maybe)
        if phantom or any(n != ROWS for n in batches.values()):
            raise Violation(f"batches never sent or half there: {phantom[:10]}")
        for T, seen in self.ledger.reads:
            again, _ = await leader.query("t", limit=None, as_of=T, partitions=[0])
            if _rows(again) != seen:
                raise Violation(f"as_of {T} read {len(seen)} rows then, {len(_rows(again))} now")
        await self.check_feed(leader)
        await self.check_replicas()

    async def check_feed(self, db: Database) -> None:
        t, _ = await db.changes("t", 0)
        ids, ts = t.column("id").to_numpy(), t.column("commit_ts").to_numpy()
        pairs = list(zip(ids.tolist(), ts.tolist()))
        if len(set(pairs)) != len(pairs):
            raise Violation("the change feed holds a write twice")
        have = set(pairs)
        for b, cts in self.ledger.acked.items():
            if any((k, cts) not in have for k in range(b * ROWS, (b + 1) * ROWS)):
                raise Violation(f"the change feed lacks acknowledged batch {b} at {cts}")

    async def check_replicas(self) -> None:
        """Every follower's copies agree with the leader's log, byte for byte, as far as both made
        them durable, and reach at least where the leader's log ended when every follower had
        caught up (the leader may append records of its own since)."""
        sh = self._shipper()
        tid, settled = self.table.table_id, self.settled_at
        for f in sh.followers:
            r = await self.nodes[f].db.replicas.replica(tid, 0)
            empty_top = settled.offset == 0 and r.position().seq == settled.seq - 1  # a segment just rolled
            if r.position() < settled and not empty_top:
                raise Violation(f"{f} holds {list(r.position())}, behind the caught-up end {list(settled)}")
            for segid, (seq, _) in r.rec.segs.items():
                copy, seg = r.files.get(segid), sh.segs.get(seq)
                if seg is None or copy is None:
                    continue  # offloaded on the leader, or not open here
                if seg.segid != segid:
                    raise Violation(f"{f} holds segment {segid} at seq {seq}, the leader's log {seg.segid}")
                # a follower may hold a group the leader still waits on (shipped before its own
                # write completes): the bytes both made durable must agree
                n = min(copy.durable_size, seg.file.durable_size)
                a, b = await copy.read(0, n), await seg.file.read(0, n)
                if a != b:
                    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    raise Violation(f"{f}'s copy of segment {segid} is not the leader's log: {n} bytes there, "
                                    f"{seg.file.durable_size} here, first difference at {at}")


def _rows(t: pa.Table) -> frozenset:
    return frozenset(zip(t.column("id").to_pylist(), t.column("b").to_pylist()))
