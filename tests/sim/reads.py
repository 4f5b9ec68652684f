"""The simulation's reader (tests/sim/world.py runs it): a client reading throughout the run —
partitions, key ranges page by page, keys, every partition at one T (RFC 0010 §4), and
partitions ``as_of`` a T answered earlier — each read recorded in the world's history
(tests/history/batches.py) with its call, return, T and rows. Like a router, it keeps sending a
partition's reads to the node that last answered them, until that node refuses (then it asks
the placement again). Its draws come from a generator of its own (``World.read_rng``), its
messages too; its reads run side by side."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from catalog.errors import CatalogError
from rowstore.errors import FutureTimestampError, RowstoreError
from terrafs.errors import TerrafsError
from tests.history.batches import Read, Region
from tests.sim.nodes import ROWS, Violation

if TYPE_CHECKING:
    from tests.sim.world import World

ERRORS = (ConnectionError, RowstoreError, TerrafsError, CatalogError)
PAGE = 16  # rows per page of a key-range scan (several pages, one T)


class SimReader:
    def __init__(self, world: "World"):
        self.w, self.rng = world, world.read_rng
        self.view: dict[int, str] = {}  # partition -> the node believed to lead it
        self.Ts: list[int] = []  # the T of every read answered (as_of reads pick among them)
        self.kinds = [self.partition, self.key_range, self.point_get, self.keys, self.across, self.as_of]
        self.weights = [4, 2, 3, 1, 2, 2]

    async def run(self, stop: asyncio.Event) -> None:
        """A read every 30-150 virtual ms, each on its own (several in flight when nodes are
        slow: reads queue up at a stopped node, as many clients' would)."""
        inflight: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                await asyncio.sleep(self.rng.uniform(0.03, 0.15))
                t = asyncio.ensure_future(self.rng.choices(self.kinds, self.weights)[0]())
                inflight.add(t)
                t.add_done_callback(inflight.discard)
        finally:
            for t in inflight:
                t.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)

    # -- one read of each kind ----------------------------------------------------------------

    async def partition(self) -> None:
        pid = self.rng.randrange(self.w.parts)
        await self._partition(pid, None)

    async def as_of(self) -> None:
        acked = list(self.w.ledger.acked.values())
        if not self.Ts and not acked:
            return
        T = self.rng.choice(self.Ts) if self.Ts and (not acked or self.rng.random() < 0.6) else self.rng.choice(acked)
        await self._partition(self.rng.randrange(self.w.parts), T)

    async def key_range(self) -> None:
        pid = self.rng.randrange(self.w.parts)
        lo = self._key()
        hi = lo + self.rng.randint(8, 400)
        node = self._target(pid)
        r = self.w.history.read("reader", Region(frozenset({pid}), lo=lo, hi=hi), note=f"via {node}, paged")

        async def pages() -> tuple[list[Any], int]:
            db = self.w.nodes[node].db
            page = await db.scan("t", start=[lo], end=[hi], limit=PAGE, partitions=[pid])
            got, T = [page.rows], page.T
            while page.more and page.last is not None:
                page = await db.scan("t", start=[lo], end=[hi], after=page.last, as_of=T, limit=PAGE,
                                     partitions=[pid])
                got.append(page.rows)
            return got, T
        try:
            got, T = await self._call(node, pages)
        except ERRORS:
            return self._refused(r, pid)
        self._answered(r, pid, node, T, pa.concat_tables(got))

    async def point_get(self) -> None:
        k = self._key()
        pid = int(self.w.layout.pids_of(np.array([k]))[0])
        node = self._target(pid)
        r = self.w.history.read("reader", Region(frozenset({pid}), keys=frozenset({k})), note=f"via {node}")
        try:
            row = await self._call(node, lambda: self.w.nodes[node].db.get("t", k))
        except ERRORS:
            return self._refused(r, pid)
        r.ok(None, [] if row is None else [(int(row["id"]), int(row["b"]))])
        self.view[pid] = node

    async def keys(self) -> None:
        pid = self.rng.randrange(self.w.parts)
        cand = np.array([self._key() for _ in range(24)], np.int64)
        ks = sorted(set(cand[self.w.layout.pids_of(cand) == pid].tolist()))
        if not ks:
            return
        node = self._target(pid)
        r = self.w.history.read("reader", Region(frozenset({pid}), keys=frozenset(ks)), note=f"via {node}")
        try:
            t, T = await self._call(node, lambda: self.w.nodes[node].db.get_rows("t", ks, partitions=[pid]))
        except ERRORS:
            return self._refused(r, pid)
        self._answered(r, pid, node, T, t)

    async def across(self) -> None:
        """Every partition at one T, as the node layer reads across nodes (RFC 0010 §4): each
        partition's node's closed timestamp, T the largest, then each at T (trusted)."""
        pids = list(range(self.w.parts))
        nodes = {pid: self._target(pid) for pid in pids}
        r = self.w.history.read("reader", Region(frozenset(pids)), note=f"across partitions via {nodes}")
        try:
            Ts = await asyncio.gather(*[self._call(n, lambda n=n: self.w.nodes[n].db.snapshot())
                                        for n in set(nodes.values())])
            T = max(Ts)
            got = await asyncio.gather(*[self._call(nodes[pid], lambda pid=pid: self.w.nodes[nodes[pid]].db.query(
                "t", limit=None, partitions=[pid], as_of=T, trusted=True)) for pid in pids])
        except ERRORS:
            for pid in pids:
                self._refused(r, pid)
            return
        r.ok(T, [kb for t, _ in got for kb in _pairs(t)])
        self.Ts.append(T)

    # -- at the end ---------------------------------------------------------------------------

    async def read_healed(self, want: int) -> None:
        """Once every fault healed, reads of the present (a partition each, in turn) until
        ``want`` were answered in the run, each retried until answered: a run whose every read
        fails would pass every other check — it must fail this one. A fault schedule that left
        no moment to answer in (every node paused or down by turns) is topped up here, rather
        than failed for what the schedule allowed (seed 40226 of ``--pause 1 --clock-jump
        0.5``: 6 answered in 30 s)."""
        answered = sum(1 for r in self.w.history.reads if r.rows is not None and r.present)
        if answered < want:
            self.w.log("reads_topped_up", answered=answered, want=want)
        for i in range(max(0, want - answered)):
            pid = i % self.w.parts
            for _ in range(30):
                if await self._partition(pid, None):
                    break
                await self.w._drive_once(set())
                await asyncio.sleep(0.2)
            else:
                raise Violation(f"a read of partition {pid}, after every fault healed, was not answered in 30 tries")

    async def repeat(self, n: int = 12) -> None:
        """Up to ``n`` partition reads answered during the run, read again as of their T
        through the partition's leader now (every fault healed): snapshots that must not move.
        A leader that refuses (it moved meanwhile) is the caller's to retry."""
        done = [r for r in self.w.history.reads if r.rows is not None and r.T is not None and len(r.region.pids) == 1
                and r.region.lo is None and r.region.keys is None]
        for old in self.rng.sample(done, min(n, len(done))):
            (pid,) = old.region.pids
            leader = self.w.place[pid].leader
            r = self.w.history.read("checker", old.region, old.T, note=f"again at the end, via {leader}")
            try:
                t, T = await self.w.nodes[leader].db.query("t", limit=None, partitions=[pid], as_of=old.T)
            except FutureTimestampError as e:  # C: the leader's clock is below a T a read was served at
                r.failed()
                raise Violation(f"{old}: as of its T now, {e}") from None
            except BaseException:
                r.failed()
                raise
            r.ok(T, _pairs(t))

    # -- helpers ------------------------------------------------------------------------------

    async def _partition(self, pid: int, as_of: int | None) -> bool:
        """Whether it was answered."""
        node = self._target(pid)
        r = self.w.history.read("reader", Region(frozenset({pid})), as_of, note=f"via {node}")
        try:
            t, T = await self._call(node, lambda: self.w.nodes[node].db.query("t", limit=None, partitions=[pid],
                                                                                as_of=as_of))
        except ERRORS:
            self._refused(r, pid)
            return False
        self._answered(r, pid, node, T, t)
        return True

    def _key(self) -> int:
        """A key of a batch sent so far, or of one about to be."""
        return self.rng.randrange((self.w.next_batch + 2) * ROWS)

    def _target(self, pid: int) -> str:
        return self.view.get(pid) or self.w.place[pid].leader

    async def _call(self, node: str, handler):
        return await self.w.net.call("reader", node, handler, self.rng)

    def _answered(self, r: Read, pid: int, node: str, T: int, t: pa.Table) -> None:
        r.ok(T, _pairs(t))
        self.view[pid] = node
        self.Ts.append(T)

    def _refused(self, r: Read, pid: int) -> None:
        if r.ret is None:
            r.failed()
        self.view[pid] = self.w.place[pid].leader


def _pairs(t: pa.Table) -> list[tuple[int, int]]:
    return list(zip(t.column("id").to_pylist(), t.column("b").to_pylist()))
