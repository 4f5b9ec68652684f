"""A simulated cluster for the seeded fault simulation: the real leader (``Shipper``), follower
(``ReplicaStore``), promotion and demotion (``Leadership``), commit paths (``Database``'s own
and a cross-node batch's ``Participant``) and election rules (``choose_leader``,
``clock_floor``, the epoch history) of three nodes in one process, over a simulated network
and simulated disks (tests/sim/nodes.py), driven by one seeded RNG on virtual time
(``tests/sim/loop.py``). What the node layer adds over HTTP — the driver's elections, each
node's reconcile, the coordinator of a batch spanning nodes, routing a batch to its
partitions' leaders — is modelled here in a few lines with the same rules. The table has two
partitions, each with its own leader, epochs and elections; a batch's rows fall in both.

Faults: kill -9 (unsynced bytes lost, optionally a torn tail), restarts, network partitions
(both ways or one way), dropped, duplicated and delayed messages (so reordered), slow links and
slow nodes, processes stopped and continued (SIGSTOP), wall-clock jumps, a disk failing every
write and sync (EIO) for a while, a disk filling up (ENOSPC) until space comes back, a
coordinator that vanishes before or after its decision. Invariants (``World.check_*``): no
acknowledged write lost, no row that was never written, no batch half applied (in one
partition and not the other), replicas equal to the leader's log once caught up (every sealed
segment whole), at most one leader per partition holding a read lease at any moment, an
``as_of`` read repeated gives the same rows, the change feed holds every acknowledged write
exactly once — and the history of every write and every read (the writers', the reader's of
``tests/sim/reads.py``, the checks' own) passes the history checks of tests/history: reads of the
present linearizable, reads at T the snapshot at T, commit timestamps in real-time order,
every batch spanning nodes resolved from its decision row, and 4 batches written once every
fault healed acknowledged (a run whose writes all fail proves nothing)."""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from catalog.abc import Check, Put
from rowstore.db.write.two_phase import COMMITTED
from catalog.errors import CatalogError
from catalog.memory import MemoryCatalog
from node.cluster import election
from node.cluster.placement import PartitionPlace
from rowstore.db.database import Database
from rowstore.errors import RowstoreError, UnavailableError
from rowstore.tables.keys import encode_keys, partition_of
from rowstore.replication.epochs import Epoch, History, epochs_key, replica_lasts
from rowstore.segments.position import NOTHING, Position
from terrafs.backends.memory import MemoryObjectStore
from terrafs.catalog_ops import commit
from terrafs.entropy import Entropy
from terrafs.errors import MirrorError, TerrafsError, TransientStorageError
from tests.history.batches import History as ClientHistory, Layout, Region, Write
from tests.sim.coordinator import coordinate
from tests.sim.checks import MIN_READS, Checks, _held_end, _rows
from tests.sim.loop import in_process
from tests.sim.reads import SimReader
from tests.sim.nodes import (LEASE_S, PARTS, ROWS, SCHEMA, FAILURE_S, Faults, Net, Node, Place, Violation)

CLIENT_ERRORS = (ConnectionError, RowstoreError, TerrafsError, CatalogError)  # as a client meets them (503s)
HEALED = 4  # batches written once every fault healed: each must be acknowledged


@dataclass
class Ledger:
    acked: dict[int, int] = field(default_factory=dict)  # batch -> commit_ts
    maybe: set[int] = field(default_factory=set)  # answered with an error: may or may not be there
    # batch -> every txn id its coordinators used (a request to the coordinator delivered twice
    # runs two transactions of the batch)
    txns: dict[int, set[int]] = field(default_factory=dict)


class StallingCatalog(MemoryCatalog):
    """The in-memory catalog, answering nothing while stalled (until ``stalled_until`` on the
    loop's virtual clock): what every caller sees of a Raft catalog during an election."""

    def __init__(self, loop, request_ids):
        super().__init__(request_ids=request_ids)
        self._loop, self.stalled_until = loop, 0.0
        self.committed_txns: set[str] = set()  # every txn/X ever written committed (its row goes once applied)

    async def _through(self) -> None:
        while self._loop.time() < self.stalled_until:
            await asyncio.sleep(self.stalled_until - self._loop.time())

    async def get(self, key):
        await self._through()
        return await super().get(key)

    async def get_many(self, keys):
        await self._through()
        return await super().get_many(keys)

    async def scan(self, prefix="", **kw):
        await self._through()
        return await super().scan(prefix, **kw)

    async def outcome(self, request_id):
        await self._through()
        return await super().outcome(request_id)

    async def txn(self, checks=(), ops=(), *, request_id=None):
        await self._through()
        res = await super().txn(checks, ops, request_id=request_id)
        if res.committed:
            self.committed_txns |= {op.key for op in ops if isinstance(op, Put) and op.key.startswith("txn/")
                                    and op.value == COMMITTED}
        return res


class World(Checks):
    def __init__(self, seed: int, loop, faults: Faults | None = None, seconds: float = 30.0, writers: int = 3,
                 parts: int = PARTS):
        self.seed, self.loop, self.rng = seed, loop, random.Random(seed)
        self.parts = parts  # the table's partitions, each with its own leader
        self.faults, self.seconds, self.writers = faults or Faults(), seconds, writers
        # the world's own catalog transactions (the driver's) draw their ids apart from the nodes'
        self.catalog = StallingCatalog(loop, Entropy(f"{seed}/world").uuid_hex)
        self.objects = MemoryObjectStore()
        self.stall_rng = random.Random(seed ^ 0xCA7A106)  # catalog stalls: apart from the other faults' draws
        self.view_rng = random.Random(seed ^ 0x71E3)  # one node's catalog or object store faults: likewise
        self.nodes = {n: Node(self, n) for n in ("n1", "n2", "n3")}
        self.net, self.ledger, self.trace = Net(self), Ledger(), []
        # every write and read as the clients saw it (tests/history): checked once all healed
        self.history = ClientHistory(loop.time)
        self.layout = Layout(ROWS, lambda keys: partition_of(encode_keys(pa.array(keys), "int64"), self.parts))
        self.read_rng = random.Random(seed ^ 0x4EAD)  # the reader's: apart from the other draws
        self.reader = SimReader(self)
        self.place: dict[int, Place] = {}
        self.settled_at: dict[int, Position] = {}
        self.table = None
        self.next_batch = 0
        self.elections = 0

    def log(self, what: str, **kw) -> None:
        self.trace.append(f"{self.loop.time():9.3f} {what} " + " ".join(f"{k}={v}" for k, v in kw.items()))

    # -- the run --------------------------------------------------------------------------------

    async def run(self) -> None:
        for n in self.nodes.values():
            await n.start()
        self.table = await self.nodes["n1"].db.create_table("t", SCHEMA, partitions=self.parts)
        names = sorted(self.nodes)
        for pid in range(self.parts):
            first = names[pid % len(names)]
            self.place[pid] = Place(first, [first, *[n for n in names if n != first]], 0, 0, NOTHING)
            await self.elect(pid, exclude=set())
        stop = asyncio.Event()
        jobs = [in_process("driver", self._driver(stop)), in_process("nemesis", self._nemesis(stop)),
                in_process("lease-watch", self._watch_leases(stop))]
        jobs += [in_process(f"client{i}", self._writer(i, stop)) for i in range(self.writers)]
        jobs += [in_process("coordinator", self._coordinator(stop)), in_process("reader", self.reader.run(stop))]
        await asyncio.sleep(self.seconds)
        stop.set()
        await self._heal()
        for j in jobs:
            j.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await self._settle()
        await self._write_healed()
        await self.reader.read_healed(MIN_READS)
        for _ in range(3):
            await self._settle()
            try:
                await self.check_all()
                return
            except (UnavailableError, MirrorError, ConnectionError) as e:  # a leadership moved meanwhile:
                self.log("check_retried", error=repr(e)[:150])  # the nodes' own jobs go on during checks
        raise Violation("the checks met a leadership change three times over")

    async def _heal(self) -> None:
        for process in list(self.loop.paused):
            self.loop.resume(process)
        self.net.cut.clear()
        self.net.slow.clear()
        self.net.slow_node.clear()
        self.catalog.stalled_until = 0.0
        for n in self.nodes.values():
            n.block.broken, n.block.capacity = False, None
            n.catalog.heal()
            n.objects.window.failing_until = 0.0
        self.faults.drop = self.faults.duplicate = 0.0
        for n in self.nodes.values():
            if not n.up:
                await n.start()
                self.log("restart", node=n.name, inc=n.inc)

    async def _settle(self) -> None:
        """Until every partition's leader leads with every follower caught up, and no participant
        holds a prepared batch any more (each resolves one its coordinator left in doubt from
        the catalog after its timeout) — every fault healed."""
        for _ in range(600):
            await self._drive_once(set())
            if all(self._caught_up(pid) for pid in range(self.parts)) and not any(
                    n.db.participant.held for n in self.nodes.values()):  # in-doubt batches resolved
                self.settled_at = {pid: _held_end(self._shipper(pid)) for pid in range(self.parts)}
                return
            await asyncio.sleep(0.1)
        raise Violation(f"no leaders with caught-up followers 60 s after healing (placement {self.place}; "
                        f"caught up {[self._caught_up(pid) for pid in range(self.parts)]}; prepared batches held "
                        f"{ {n.name: n.db.participant.held for n in self.nodes.values()} }; "
                        f"{[(s.status() if (s := self._shipper(pid)) else None) for pid in range(self.parts)]})")

    def _caught_up(self, pid: int) -> bool:
        """Every follower holds all the leader made durable (lag 0 alone is not enough: a follower
        may hold all of an offloaded segment and not yet the next one's first group), and no
        file of the leader's log failed at the disk (its leader steps down, or revives it)."""
        sh = self._shipper(pid)
        return sh is not None and sh.lease_ok() and (self.table.table_id, pid) not in self._leader(
            pid).store.failed() and all(
            (p := sh.status()["followers"][f]["pos"]) is not None and Position(*p) >= _held_end(sh)
            for f in sh.followers)

    def _shipper(self, pid: int):
        n = self.nodes[self.place[pid].leader]
        return n.db.leadership.shipper(self.table.table_id, pid) if n.up and n.db else None

    # -- the driver: elections (node/cluster/controller.py's rules) -----------------------------

    async def _driver(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.1)
            now = self.loop.time()
            # dead: down, or stopped (SIGSTOP: its heartbeats stopped too), for FAILURE_S
            dead = {n.name for n in self.nodes.values() if (not n.up and now - n.down_at > FAILURE_S) or (
                n.process in self.loop.paused and now - n.paused_at > FAILURE_S)}
            await self._drive_once(dead)

    async def _drive_once(self, dead: set[str]) -> None:
        for pid in range(self.parts):
            if self.place[pid].leader in dead:  # a leader alive but not leading takes it itself (Node.take)
                await self.elect(pid, exclude=dead)

    async def elect(self, pid: int, exclude: set[str], src: str = "driver") -> bool:
        """The node layer's election rounds (node/cluster/election.py) over the simulated
        network, run by the driver or by a node taking a partition (``src``); then the chosen
        node is told to take it — unless it ran the election itself (it takes it then, as
        ``NodeReplication.take`` does after its own ``elect``)."""
        p = self.place[pid]
        voters = [n for n in p.replicas if n not in exclude]
        if len(voters) < 2:
            return False
        was = PartitionPlace(tuple(p.replicas), p.epoch, p.base, tuple(p.start))
        won = await election.elect(was, voters, 2, _SimBallot(self, pid, src), LEASE_S, where=f"t/{pid}")
        if won is None:
            return False
        new, ok = won.place, won.answers
        chosen, epoch, base, start = new.leader, new.epoch, new.base, Position(*new.start)
        self.place[pid] = Place(chosen, list(new.replicas), epoch, base, start)
        self.elections += 1
        self.log("elected", pid=pid, leader=chosen, epoch=epoch, base=base, start=list(start), by=src,
                 answers={n: (a["last"], a["pos"]) for n, a in ok.items()})
        if chosen != src:
            node = self.nodes[chosen]
            try:
                await self.net.call(src, chosen, lambda: node.take(pid))
            except CLIENT_ERRORS as e:  # it takes it at its next reconcile
                self.log("promote_failed", pid=pid, node=chosen, error=repr(e)[:120])
        return True

    async def _record(self, pid: int, epoch: int, base: int, start: Position, floor: int) -> bool:
        """The epoch history, as the election writes it with the placement: refused when an
        election of ``epoch`` or later was recorded first (the placement's compare-and-set in
        the node layer; here elections run from the driver and from nodes at once)."""
        key = epochs_key(self.table.table_id, pid)
        e = await self.catalog.get(key)
        h = History.from_bytes(e.value, key) if e is not None else History([])
        if any(x.epoch >= epoch for x in h.epochs):
            return False
        res = await commit(self.catalog, [Check(key, e.version if e else 0)],
                           [Put(key, h.with_epoch(Epoch(epoch, base, start, floor), await replica_lasts(
                               self.catalog, self.table.table_id, pid)).to_bytes())])
        return res.committed

    # -- clients --------------------------------------------------------------------------------

    def _batch(self, b: int) -> tuple[pa.Table, np.ndarray]:
        """Batch ``b``'s rows and the partition of each."""
        keys = np.arange(b * ROWS, (b + 1) * ROWS, dtype=np.int64)
        rows = pa.table({"id": keys, "b": np.full(ROWS, b, np.int64)})
        return rows, partition_of(encode_keys(rows.column("id"), "int64"), self.parts)

    async def _writer(self, i: int, stop: asyncio.Event) -> None:
        """A client writing batches through the node layer's routing: to the one node leading
        every partition they touch (its own atomic commit), else as a batch spanning nodes."""
        rng = random.Random(self.rng.randrange(1 << 30))
        while not stop.is_set():
            b = self.next_batch
            self.next_batch += 1
            self.ledger.maybe.add(b)  # until it is answered: a write in flight may land
            await self._write(f"client{i}", b, rng)
            if rng.random() < 0.05:
                await self._read()
            await asyncio.sleep(rng.randint(1, 30) / 1000)

    async def _write(self, src: str, b: int, rng: random.Random) -> int | None:
        """Batch ``b`` through the node layer's routing: to the one node leading every partition
        it touches (its own atomic commit), else as a batch spanning nodes. Its commit_ts once
        acknowledged; None otherwise (the client learnt no outcome)."""
        rows, pids = self._batch(b)
        leaders = {self.place[int(p)].leader for p in np.unique(pids)}
        op = self.history.write(src, b)
        try:
            if len(leaders) == 1:
                (leader,) = leaders
                res = await self.net.call(src, leader, lambda n=leader, rows=rows: self.nodes[n].db.upsert("t", rows))
                ts = res.commit_ts
            else:
                ts = await self._transaction(src, b, rows, pids, rng, op)
        except CLIENT_ERRORS:
            ts = None
        if ts is None:
            op.unknown()
            return None
        self.ledger.acked[b] = ts
        self.ledger.maybe.discard(b)
        op.ok(ts)
        return ts

    async def _write_healed(self) -> None:
        """Once every fault healed, HEALED batches, one after another, each retried until
        acknowledged (an election driven between tries): a run whose every write fails would
        pass every other check — it must fail this one."""
        rng = random.Random(self.seed ^ 0x4EA1)
        for _ in range(HEALED):
            b = self.next_batch
            self.next_batch += 1
            self.ledger.maybe.add(b)
            for _ in range(30):
                if await self._write("healed", b, rng) is not None:
                    break
                await self._drive_once(set())
                await asyncio.sleep(0.2)
            else:
                raise Violation(f"batch {b}, written after every fault healed, was not acknowledged in 30 tries")

    async def _coordinator(self, stop: asyncio.Event) -> None:
        """Batches spanning nodes always (RFC 0010 §3), even when one node leads both partitions
        (then it is the one participant): reserve, prepare (given up after 0.4 s: then aborted,
        often while a prepare's append still waits for a majority), decide in the catalog,
        commit — and now and then the coordinator vanishes before or after its decision."""
        rng = random.Random(self.rng.randrange(1 << 30))
        while not stop.is_set():
            await asyncio.sleep(rng.randint(5, 60) / 1000)
            b = self.next_batch
            self.next_batch += 1
            rows, pids = self._batch(b)
            self.ledger.maybe.add(b)
            op = self.history.write("coordinator", b)
            try:
                ts = await self._transaction("coordinator", b, rows, pids, rng, op)
            except CLIENT_ERRORS:
                op.unknown()
                continue
            if ts is not None:
                self.ledger.acked[b] = ts
                self.ledger.maybe.discard(b)
                op.ok(ts)
            else:
                op.unknown()

    async def _transaction(self, src: str, b: int, rows: pa.Table, pids: np.ndarray, rng: random.Random,
                           op: Write) -> int | None:
        """One batch through the node layer's coordinator (node/cluster/commit.py), run on the
        node the client sent it to (tests/sim/coordinator.py): its timestamp once every
        participant committed it, else None (aborted, or its outcome left to the participants:
        the client got an error). ``op`` learns the decision row's name (txn/X) — what resolves
        it once the faults healed."""
        mine: dict[str, list[int]] = {}
        for pid in np.unique(pids).tolist():
            mine.setdefault(self.place[pid].leader, []).append(pid)
        shares = {who: rows.filter(pa.array(np.isin(pids, ps))) for who, ps in mine.items()}
        me = rng.choice(sorted(self.nodes))  # any node routes a batch: the one the client reached
        try:
            return await self.net.call(src, me, lambda: coordinate(self, me, shares, op, rng))
        except CLIENT_ERRORS as e:
            self.log("txn_aborted", batch=b, via=me, error=repr(e)[:150])
            return None

    async def _read(self) -> None:
        """A writer's read of a partition at the present, through its leader."""
        pid = self.rng.randrange(self.parts)
        leader = self.place[pid].leader
        r = self.history.read("reader", Region(frozenset({pid})), note=f"via {leader}")
        try:
            t, T = await self.net.call("reader", leader, lambda: self.nodes[leader].db.query(
                "t", limit=None, partitions=[pid]))
        except CLIENT_ERRORS:
            r.failed()
            return
        r.ok(T, _rows(t))

    # -- faults ---------------------------------------------------------------------------------

    async def _nemesis(self, stop: asyncio.Event) -> None:
        f, step = self.faults, 0.05
        while not stop.is_set():
            await asyncio.sleep(step)
            r = self.rng.random
            if r() < f.crash * step:
                up = [n for n in self.nodes.values() if n.up]
                if len(up) >= 2:
                    lead = self.nodes[self.place[self.rng.randrange(self.parts)].leader]
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
                    a = self.place[self.rng.randrange(self.parts)].leader
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
            if r() < f.pause * step:
                n = self.nodes[self.rng.choice(sorted(self.nodes))]
                if n.up and n.process not in self.loop.paused:
                    self.loop.pause(n.process)
                    n.paused_at = self.loop.time()
                    self.log("pause", node=n.name)
                    in_process("nemesis", self._resume_later(n.process, self.rng.uniform(0.1, 3.0)))
            if r() < f.clock_jump * step:
                n = self.rng.choice(sorted(self.nodes))
                jump = self.rng.choice([-1, 1]) * self.rng.randint(1, 5000)
                self.nodes[n].skew_ms += jump
                self.log("clock_jump", node=n, ms=jump)
            if f.catalog_stall and self.stall_rng.random() < f.catalog_stall * step:
                until = self.loop.time() + self.stall_rng.uniform(0.2, 1.5)
                self.catalog.stalled_until = max(self.catalog.stalled_until, until)
                self.log("catalog_stall", until=f"{until:.3f}")
            self._node_views(f, step)

    def _node_views(self, f: Faults, step: float) -> None:
        """One node's own path to the catalog or to the object store fails for a while."""
        v = self.view_rng
        if f.node_catalog and v.random() < f.node_catalog * step:
            n = self.nodes[v.choice(sorted(self.nodes))]
            how = v.choice(["stalled_until", "failing_until", "losing_until"])
            until = self.loop.time() + v.uniform(0.2, 2.0)
            setattr(n.catalog, how, max(getattr(n.catalog, how), until))
            self.log("node_catalog", node=n.name, fault=how.removesuffix("_until"), until=f"{until:.3f}")
        if f.node_objects and v.random() < f.node_objects * step:
            n = self.nodes[v.choice(sorted(self.nodes))]
            until = self.loop.time() + v.uniform(0.2, 2.0)
            n.objects.window.failing_until = max(n.objects.window.failing_until, until)
            self.log("node_objects", node=n.name, until=f"{until:.3f}")

    async def _restart_later(self, n: Node, after: float) -> None:
        await asyncio.sleep(after)
        while not n.up:
            try:
                await n.start()
            except (CatalogError, TransientStorageError) as e:  # its own path to the catalog or the
                self.log("start_failed", node=n.name, error=repr(e)[:100])  # objects failed (views.py):
                await asyncio.sleep(1.0)  # its process exited; systemd starts it again
                continue
            self.log("restart", node=n.name, inc=n.inc)

    async def _resume_later(self, process: str, after: float) -> None:
        await asyncio.sleep(after)
        if process in self.loop.paused:
            self.loop.resume(process)
            self.log("resume", process=process)

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


class _SimBallot:
    """An election's fences over the simulated network (each given up after the failure
    timeout, as the driver's: a stopped voter would hold the election, and every other
    partition's, for a whole request) and its record: the epoch history in the catalog (the
    placement itself is the world's, ``World.place``)."""

    def __init__(self, world: World, pid: int, src: str):
        self.w, self.pid, self.src = world, pid, src

    async def fence(self, node: str, epoch: int, force: bool) -> dict:
        w, tid = self.w, self.w.table.table_id
        answer = w.net.call(self.src, node, lambda: _fence(w.nodes[node].db, tid, self.pid, epoch))
        return await asyncio.wait_for(answer, FAILURE_S)

    async def write(self, was: PartitionPlace, new: PartitionPlace, floor: int) -> bool:
        p = self.w.place[self.pid]
        if PartitionPlace(tuple(p.replicas), p.epoch, p.base, tuple(p.start)) != was:
            return False  # another election placed it since
        return await self.w._record(self.pid, new.epoch, new.base, Position(*new.start), floor)


async def _fence(db: Database, tid: str, pid: int, epoch: int) -> dict:
    """A promise, answered as the node's route answers it (whether it could take writes too)."""
    return {**await db.leadership.fence(tid, pid, epoch), "writable": db.can_write()}
